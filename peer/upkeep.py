"""The work a serving peer repeats (peer/runtime.py wires an `Upkeep` and runs it): following
the swarm's records and plans, and logging where its steps' time went.

- `Upkeep.coordinate`, every announce period: the peers it may push to, round trips to them
  (peer/link_probe.py), and for an auto peer the plan or Petals' rule (peer/plan_follower.py);
- `Upkeep.watch_plans`, a service beside it: an auto peer follows a newly published plan as soon
  as its coordinator says it is out (swarm/coordinator/nudges.py);
- `log_hop_cost`, every announce period and at the end.

Everything here reads remote input, so a failed step is logged and the peer goes on serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from hexswarm.peer.announcer import Announcer
from hexswarm.peer.link_probe import LinkProbe
from hexswarm.peer.plan_follower import PlanFollower
from hexswarm.peer.push import SwarmMembers
from hexswarm.swarm.trust.records import PeerRecord, PeerState

logger = logging.getLogger(__name__)

MOVE_POLL_S = 0.5  # how often a nudge taken during a range move checks whether it ended


@dataclass(frozen=True)
class Upkeep:
    """What the repeated work reads and drives: peer/runtime.py wires it once the peer serves,
    so what coordinating may touch is written here rather than found on the peer."""

    read_records: Callable[[], Awaitable[list[PeerRecord]]]  # the model's records (dials learn them)
    record: Callable[[PeerState], PeerRecord]  # this peer's record, as it would announce it now
    announcer: Announcer
    probe: LinkProbe
    members: SwarmMembers  # whom pushes may go to (peer/push.py)
    follower: PlanFollower | None  # an auto peer's
    moving: Callable[[], bool]  # whether a range move runs (the plan waits for it)

    async def records_now(self) -> list[PeerRecord]:
        """The model's records, read once for a period's steps; none if the read failed."""
        try:
            return await self.read_records()
        except Exception as e:  # remote input, or a DHT process that does not answer
            logger.warning("reading the swarm's records failed: %s", type(e).__name__)
            return []

    async def coordinate(self, records: list[PeerRecord] | None = None) -> None:
        """Measures round trips and, for an auto peer, follows the plan (or Petals' rule);
        `records`: the model's records if the caller read them this period."""
        try:
            records = await self.read_records() if records is None else records
            self.members.update(r.peer_id for r in records)
            mine = self.record(PeerState.ONLINE)
            await self.probe.step(records, (mine.start, mine.end))
            if self.follower is not None and not self.moving():
                followed = self.follower.followed
                await self.follower.step(records, self.record(PeerState.ONLINE), time.monotonic())
                if self.follower.followed != followed:  # say so now, not a period later (status, monitor)
                    await self.announcer.announce(PeerState.ONLINE)
        except Exception:  # the swarm's records are remote input: a bad step must not stop serving
            logger.exception("coordination step failed")

    async def watch_plans(self, stop: asyncio.Event) -> None:
        """An auto peer reads and follows the plan when its coordinator says a new one is out
        (peer/plan_follower.py); a nudge that comes during a range move is taken after it."""
        if self.follower.trusts_none:  # no plan could ever be followed
            return
        while await self.follower.inbox.wait(stop):
            while self.moving() and not stop.is_set():
                await asyncio.sleep(MOVE_POLL_S)
            try:
                if await self.follower.follow_newer(self.record(PeerState.ONLINE)):
                    await self.announcer.announce(PeerState.ONLINE)  # the plan followed, at once
            except Exception:  # the plans are remote input: a bad read must not stop serving
                logger.exception("reading the coordinator's plan failed")


def log_hop_cost(server) -> None:
    """Logs where the period's steps spent their time on `server`, the decode batches its compute
    thread formed and how busy it was (benchmarks/concurrency.py reads these lines)."""
    stats, scheduler = server.hop_stats.take(), server.scheduler
    busy_s, period_s = scheduler.take_busy()  # of this period, whether steps ran or not
    if stats.steps:
        sizes = dict(sorted(scheduler.batch_sizes.items()))
        logger.info(
            "%s; decode batches (rows: count) %s; compute busy %.3f s of %.3f s",
            stats.summary(), sizes, busy_s, period_s,
        )  # fmt: skip
        scheduler.batch_sizes.clear()
