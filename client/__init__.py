"""The hexswarm client: a Hugging Face model whose layers run in the swarm.

The names below load on first use (PEP 562): the commands that live in this package
(`hexswarm api`, `monitor`, `status`) parse their flags without loading the model code
(torch, transformers) first.
"""

from __future__ import annotations

import importlib

from hexswarm.swarm.tools.threads import configure_openmp

configure_openmp()  # before torch loads, if it has not yet (see swarm/tools/threads.py)

# public name -> the module that defines it
_EXPORTS = {
    "DistributedModelForCausalLM": "hexswarm.client.model",
    "PeerError": "hexswarm.client.remote",
    "FailoverError": "hexswarm.client.retry",
    "SpanUnservedError": "hexswarm.client.retry",
    "RetryPolicy": "hexswarm.client.retry",
    "MissingBlocksError": "hexswarm.client.swarm_client",
    "ModelMismatchError": "hexswarm.client.swarm_client",
    "FormatMismatchError": "hexswarm.client.swarm_client",
    "NoChainError": "hexswarm.client.chain_choice",
    "InitialPeersError": "hexswarm.swarm.net.dht",
    "NotComparedError": "hexswarm.client.verify_records",
    "UnsettledDisputeError": "hexswarm.client.verify_records",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
