"""The hexswarm client: a Hugging Face model whose layers run in the swarm."""

from swarm.threads import configure_openmp

configure_openmp()  # before torch loads, if it has not yet (see swarm/threads.py)

# ruff: noqa: E402

from client.failover import NoChainError
from client.model import DistributedModelForCausalLM
from client.remote import PeerError
from client.retry import FailoverError, RetryPolicy
from client.swarm_client import MissingBlocksError, ModelMismatchError

__all__ = [
    "DistributedModelForCausalLM",
    "PeerError",
    "FailoverError",
    "RetryPolicy",
    "MissingBlocksError",
    "ModelMismatchError",
    "NoChainError",
]
