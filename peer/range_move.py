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

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import PeerCore
from hexswarm.peer.plan_follower import goes_first_in_a_swap, old_range_covered
from hexswarm.peer.server import PeerServer
from hexswarm.swarm.trust.records import PeerState

logger = logging.getLogger(__name__)


class RangeMover:
    """Carries out one move at a time for `peer` (peer/runtime.py's `_Peer`)."""

    def __init__(self, peer):
        self.peer = peer
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
            self.task = asyncio.create_task(self._move(start, end, tp or self.peer.tp), name="move")
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
        peer, c = self.peer, self.peer.config
        old, new, old_tp = (peer.start, peer.end), (start, end), peer.tp
        logger.info("moving: loading [%d:%d) at tp %d while serving [%d:%d) at tp %d", *new, tp, *old, old_tp)
        self.next_range = new
        await peer.announcer.announce(PeerState.ONLINE)
        if peer.group is not None:
            blocks = await asyncio.to_thread(peer.group.load_stack, start, end, tp)
        else:
            blocks = await asyncio.to_thread(
                BlockStack.load, c.spec, start, end, c.dtype, c.devices[0], quant=c.quant
            )
        speed = await peer.speed_of(blocks) if tp != old_tp else None
        await self._wait_until_covered(old, new)
        was = peer.serving
        core = PeerCore(blocks, c.spec.model_id, c.limits, c.prefill_threads)
        self.next_range = None
        peer.swap(was.moved(core, peer.new_server(core), start, end, tp, speed))
        await peer.announcer.announce(PeerState.ONLINE)
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
        peer = self.peer
        me = peer.identity.peer_id.to_base58()
        deadline = time.monotonic() + peer.config.move_wait
        while not old_range_covered(records := await peer.read_records(), me, old, new):
            if goes_first_in_a_swap(records, me, old, new):
                logger.info(
                    "moving: the peer loading [%d:%d)'s blocks waits for this one; switching first", *old
                )
                return
            if time.monotonic() > deadline or peer.stop.is_set():
                logger.warning(
                    "moving: blocks of [%d:%d) have no other online peer; dropping them anyway", *old
                )
                return
            await peer.announcer.announce(PeerState.ONLINE)  # keeps the record fresh while waiting
            await asyncio.sleep(min(1.0, peer.config.announce_period))

    async def _drain(self, core: PeerCore, server: PeerServer) -> None:
        """Lets the old range's open sessions finish (at most drain_timeout), then frees it."""
        deadline = time.monotonic() + self.peer.config.drain_timeout
        while core.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            core.expire_idle()
        server.close()
        if self.peer.group is not None:
            self.peer.group.drop_stack(core.blocks)
        logger.info("dropped the old range [%d:%d)", core.blocks.start, core.blocks.end)
