"""The hexswarm client: a Hugging Face model whose layers run in the swarm.

The names below load on first use (PEP 562): the commands that live in this package
(`hexswarm api`, `monitor`, `status`) parse their flags without loading the model code
(torch, transformers) first.
"""

from __future__ import annotations

import importlib

from swarm.threads import configure_openmp

configure_openmp()  # before torch loads, if it has not yet (see swarm/threads.py)

# public name -> the module that defines it
_EXPORTS = {
    "DistributedModelForCausalLM": "client.model",
    "PeerError": "client.remote",
    "FailoverError": "client.retry",
    "RetryPolicy": "client.retry",
    "MissingBlocksError": "client.swarm_client",
    "ModelMismatchError": "client.swarm_client",
    "NoChainError": "client.failover",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
