"""`run-peer --coordinator`: a coordinator candidate on the peer's own DHT node.

The planning code loads only when the flag is given: most peers never run a candidate.
"""

from __future__ import annotations

import asyncio


def start_beside_peer(config, dht, identity, stop: asyncio.Event, inbox=None) -> asyncio.Task | None:
    """A candidate on `dht`, ended by `stop`; `config` is the peer's CoordinatorConfig, None
    without the flag (then nothing starts). `inbox`: an auto peer's NudgeInbox, which the
    candidate tells of its new plans directly (swarm/coordinator/nudges.py)."""
    if config is None:
        return None
    from hexswarm.swarm.coordinator.service import Coordinator

    return asyncio.create_task(Coordinator(dht, identity, config, inbox).run(stop), name="coordinator")
