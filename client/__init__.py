"""The hexswarm client: a Hugging Face model whose layers run in the swarm."""

from client.model import DistributedModelForCausalLM
from client.remote import PeerError
from client.retry import FailoverError, RetryPolicy
from client.swarm_client import MissingBlocksError

__all__ = ["DistributedModelForCausalLM", "PeerError", "FailoverError", "RetryPolicy", "MissingBlocksError"]
