"""`run-peer --coordinator`: a coordinator candidate on the peer's own DHT node.

The planning code loads only when the flag is given: most peers never run a candidate.
"""

from __future__ import annotations

import asyncio


def start_beside_peer(config, dht, identity, stop: asyncio.Event) -> asyncio.Task | None:
    """A candidate on `dht`, ended by `stop`; `config` is the peer's CoordinatorConfig, None
    without the flag (then nothing starts)."""
    if config is None:
        return None
    from hexswarm.swarm.coordinator.service import Coordinator

    return asyncio.create_task(Coordinator(dht, identity, config).run(stop), name="coordinator")
