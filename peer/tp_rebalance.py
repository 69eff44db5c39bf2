"""The leader's re-partition loop for a `--partition auto` group (Hepti §4.3, "re-partition at
run time"): once a second it reads each rank's observed compute per decode step, lets the drift
check (peer/tp_partition.py) decide, and when it proposes a better split, moves the group to it
make-before-break (peer/tp_group.py) and announces the new shares and step time.
"""

from __future__ import annotations

import asyncio
import logging
import math

from hexswarm.swarm.records import PeerState

logger = logging.getLogger(__name__)

PERIOD_S = 1.0


async def rebalance(peer, stop: asyncio.Event) -> None:
    """Runs until `stop` for `peer` (peer/runtime.py's _Peer) whose group has a Repartitioner."""
    group = peer.group
    blocks = peer.core.blocks  # TPBlocks (a --debug-corrupt-outputs wrapper passes attributes on)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), PERIOD_S)
            return
        except TimeoutError:
            pass
        observed, steps = group.decode_window(blocks.stack_id, group.repartitioner.policy.min_steps)
        if not observed:
            continue  # a window needs enough decode steps on every rank
        step_s, step_count = blocks.read_decode_step_s()
        if step_count and math.isfinite(step_s):
            _note_step(peer, step_s)
        proposal = group.repartitioner.check(observed, steps)
        if proposal is None or proposal == group.partition:
            continue
        logger.info(
            "observed compute per rank %s ms against predicted %s ms: re-partitioning",
            [round(s * 1000, 2) for s in observed],
            [round(s * 1000, 2) for s in group.repartitioner.predicted],
        )
        await asyncio.to_thread(group.repartition, blocks, proposal)
        await peer.announcer.announce(PeerState.ONLINE)


def _note_step(peer, step_s: float) -> None:
    """The group's measured decode step becomes what the peer announces (its decode ms per
    block, and its prefill figure scaled alike) once the group has re-partitioned."""
    group = peer.group
    group.observed_step_s = step_s
    if not group.repartitions:
        return
    blocks = peer.end - peer.start
    prefill, decode_ms = peer.throughput
    new_ms = step_s * 1000 / blocks
    peer.throughput = (prefill * decode_ms / new_ms if decode_ms else prefill, new_ms)
