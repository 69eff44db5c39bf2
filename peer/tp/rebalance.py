"""The leader's re-partition loop for a `--partition auto` group (Hepti §4.3, "re-partition at
run time"): once a second it reads each rank's observed compute per decode step, lets the drift
check (peer/tp/partition.py) decide, and when it proposes a better split, moves the group to it
make-before-break (peer/tp/group.py) and announces the new shares and step time.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hexswarm.peer.announcer import Announcer
from hexswarm.peer.serving import Serving
from hexswarm.swarm.trust.records import PeerState

if TYPE_CHECKING:
    from hexswarm.peer.tp.group import TPGroup

logger = logging.getLogger(__name__)

PERIOD_S = 1.0


@dataclass(frozen=True)
class Rebalancing:
    """What the loop reads and drives: peer/runtime.py wires it, for a group with a Repartitioner."""

    group: TPGroup
    serving: Callable[[], Serving]  # what the peer serves now
    swap: Callable[[Serving], None]  # serves a new value from now on (its new measured speed)
    announcer: Announcer


async def rebalance(parts: Rebalancing, stop: asyncio.Event) -> None:
    """Runs until `stop`, checking the drift of `parts.group` once every PERIOD_S."""
    blocks = parts.serving().core.blocks  # TPBlocks (a --debug-corrupt-outputs wrapper passes attributes on)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), PERIOD_S)
            return
        except TimeoutError:
            pass
        try:
            await _window(parts, blocks)
        except Exception:  # a failed check or move must not end the peer's serving
            logger.exception("re-partition check failed")


def _note_step(parts: Rebalancing, step_s: float) -> None:
    """The group's measured decode step becomes what the peer announces (its decode ms per
    block, and its prefill figure scaled alike) once the group has re-partitioned."""
    group = parts.group
    group.observed_step_s = step_s
    if not group.repartitions:
        return
    serving = parts.serving()
    blocks = serving.end - serving.start
    prefill, decode_ms = serving.throughput
    new_ms = step_s * 1000 / blocks
    parts.swap(replace(serving, throughput=(prefill * decode_ms / new_ms if decode_ms else prefill, new_ms)))


async def _window(parts: Rebalancing, blocks) -> None:
    """One check of the drift: reads the window's figures and re-partitions if it should."""
    group = parts.group
    observed, steps = group.decode_window(blocks.stack_id, group.repartitioner.policy.min_steps)
    if not observed:
        return  # a window needs enough decode steps on every rank
    step_s, step_count = blocks.read_decode_step_s()
    if step_count and math.isfinite(step_s):
        _note_step(parts, step_s)
    predicted = group.repartitioner.predicted
    proposal = group.repartitioner.check(observed, steps)
    logger.debug(
        "decode compute per rank over %d steps: observed %s ms, predicted %s ms (drifted windows: %d)",
        steps,
        [round(s * 1000, 2) for s in observed],
        [round(s * 1000, 2) for s in predicted],
        group.repartitioner.strikes,
    )
    if proposal is None:
        return
    logger.info(
        "observed compute per rank %s ms against predicted %s ms: re-partitioning",
        [round(s * 1000, 2) for s in observed],
        [round(s * 1000, 2) for s in predicted],
    )
    await asyncio.to_thread(group.repartition, blocks, proposal)
    await parts.announcer.announce(PeerState.ONLINE)
