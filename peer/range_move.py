"""Moving a running peer to another layer range without a dip in coverage.

Steps (docs/scheduling.md "The coordinator"): announce the new range as joining (the record's
`next_start:next_end`, the old range still online), load it while the old range keeps serving,
wait until every block of the old range is served by another online peer or by the new range
(at most `move_wait`: peers moving in a cycle would otherwise wait for each other forever),
then switch: new streams reach the new range, streams already open stay on the old one,
whose sessions finish (at most `drain_timeout`) before its blocks are freed.

A tensor-parallel peer moves the same way: every rank loads its shard of the new range as a
second stack beside the old one (`TPGroup.load_stack`), sessions run on the stack they opened
on, and the old stack is freed on every rank once its sessions have drained. A change of
degree (`--tp auto`, chosen by the plan) is such a move too, over the ranks of the new degree;
the new stack's speed is measured (or read from the cache) before the switch, so the peer
announces the figures of the degree it serves at.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from hexswarm.peer.announcer import Announcer
from hexswarm.peer.config import PeerConfig
from hexswarm.peer.core import PeerCore
from hexswarm.peer.plan_follower import goes_first_in_a_swap, old_range_covered
from hexswarm.peer.server import PeerServer
from hexswarm.peer.serving import Serving
from hexswarm.peer.speed import announced_speed
from hexswarm.peer.stacks import Stacks
from hexswarm.swarm.trust.records import PeerRecord, PeerState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MoveParts:
    """What a move reads and drives: peer/runtime.py wires it, so a move touches these only."""

    config: PeerConfig
    peer_id: str
    stop: asyncio.Event  # set when the peer leaves: a move stops waiting for others to cover
    announcer: Announcer  # announces the range being loaded, then the new one
    read_records: Callable[[], Awaitable[list[PeerRecord]]]  # the model's records now
    stacks: Stacks  # loads the new range, frees the old one
    serving: Callable[[], Serving]  # what the peer serves now
    swap: Callable[[Serving], None]  # serves the new range from now on
    new_server: Callable[[PeerCore], PeerServer]  # the stream server over a new range's core


class RangeMover:
    """Carries out one move at a time, with `parts`."""

    def __init__(self, parts: MoveParts):
        self.parts = parts
        self.task: asyncio.Task | None = None
        self.next_range: tuple[int, int] | None = None  # the range being loaded (announced as next)
        self.draining: set[asyncio.Task] = set()  # old ranges finishing their sessions

    @property
    def busy(self) -> bool:
        return self.task is not None

    async def request(self, start: int, end: int, tp: int | None = None) -> None:
        """Starts moving to [start, end) at degree `tp` (None: the current one) in the background;
        ignored while a move runs."""
        if self.task is None:
            self.task = asyncio.create_task(
                self._move(start, end, tp or self.parts.serving().tp), name="move"
            )
            self.task.add_done_callback(self._done)

    def cancel(self) -> None:
        for task in (self.task, *self.draining):
            if task is not None:
                task.cancel()

    def _done(self, task: asyncio.Task) -> None:
        self.task, self.next_range = None, None
        if not task.cancelled() and task.exception() is not None:
            logger.error("move failed: %r", task.exception())

    async def _move(self, start: int, end: int, tp: int) -> None:
        parts, c = self.parts, self.parts.config
        serving = parts.serving()
        old, new, old_tp = (serving.start, serving.end), (start, end), serving.tp
        logger.info("moving: loading [%d:%d) at tp %d while serving [%d:%d) at tp %d", *new, tp, *old, old_tp)
        self.next_range = new
        await parts.announcer.announce(PeerState.ONLINE)
        blocks = await asyncio.to_thread(parts.stacks.load, start, end, tp)
        speed = await announced_speed(c, blocks) if tp != old_tp else None
        await self._wait_until_covered(old, new)
        was = parts.serving()
        core = PeerCore(blocks, c.spec.model_id, c.limits, c.prefill_threads)
        self.next_range = None
        parts.swap(was.moved(core, parts.new_server(core), start, end, tp, speed))
        await parts.announcer.announce(PeerState.ONLINE)
        logger.info(
            "moved: serving %s blocks [%d:%d) at tp %d (was [%d:%d) at tp %d)",
            c.spec.model_id,
            *new,
            tp,
            *old,
            old_tp,
        )
        was.core.leaving = True
        drain = asyncio.create_task(self._drain(was.core, was.server), name="drain")
        self.draining.add(drain)
        drain.add_done_callback(self.draining.discard)

    async def _wait_until_covered(self, old: tuple[int, int], new: tuple[int, int]) -> None:
        parts, me = self.parts, self.parts.peer_id
        deadline = time.monotonic() + parts.config.move_wait
        while not old_range_covered(records := await parts.read_records(), me, old, new):
            if goes_first_in_a_swap(records, me, old, new):
                logger.info(
                    "moving: the peer loading [%d:%d)'s blocks waits for this one; switching first", *old
                )
                return
            if time.monotonic() > deadline or parts.stop.is_set():
                logger.warning(
                    "moving: blocks of [%d:%d) have no other online peer; dropping them anyway", *old
                )
                return
            await parts.announcer.announce(PeerState.ONLINE)  # keeps the record fresh while waiting
            await asyncio.sleep(min(1.0, parts.config.announce_period))

    async def _drain(self, core: PeerCore, server: PeerServer) -> None:
        """Lets the old range's open sessions finish (at most drain_timeout), then frees it."""
        deadline = time.monotonic() + self.parts.config.drain_timeout
        while core.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            core.expire_idle()
        server.close()
        self.parts.stacks.drop(core.blocks)
        logger.info("dropped the old range [%d:%d)", core.blocks.start, core.blocks.end)
