"""The work a serving peer repeats (peer/runtime.py's _Peer runs it): following the swarm's
records and plans, and logging where its steps' time went.

- `coordinate`, every announce period: the peers it may push to, round trips to them
  (peer/link_probe.py), and for an auto peer the plan or Petals' rule (peer/plan_follower.py);
- `watch_plans`, a service beside it: an auto peer follows a newly published plan within
  PLAN_WATCH_S (hivemind has no subscriptions, so the plan's small key is read that often);
- `log_hop_cost`, every announce period and at the end.

Everything here reads remote input, so a failed step is logged and the peer goes on serving.
"""

from __future__ import annotations

import asyncio
import logging
import time

from hexswarm.peer.peer_record import peer_record
from hexswarm.peer.plan_follower import PLAN_WATCH_S
from hexswarm.swarm.trust.records import PeerState

logger = logging.getLogger(__name__)


async def coordinate(peer) -> None:
    """Measures round trips and, for an auto peer, follows the plan (or Petals' rule)."""
    try:
        records = await peer.read_records()
        if peer.pusher is not None:
            peer.pusher.members.update(r.peer_id for r in records)
        await peer.probe.step(records)
        if peer.follower is not None and not peer.mover.busy:
            followed = peer.follower.followed
            await peer.follower.step(records, peer_record(peer, PeerState.ONLINE), time.monotonic())
            if peer.follower.followed != followed:  # say so now, not a period later (status, monitor)
                await peer.announcer.announce(PeerState.ONLINE)
    except Exception:  # the swarm's records are remote input: a bad step must not stop serving
        logger.exception("coordination step failed")


async def watch_plans(peer, stop: asyncio.Event) -> None:
    """An auto peer follows a newly published plan within PLAN_WATCH_S."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=PLAN_WATCH_S)
        except TimeoutError:
            pass
        if stop.is_set() or peer.mover.busy:
            continue
        try:
            if await peer.follower.follow_newer(peer_record(peer, PeerState.ONLINE)):
                await peer.announcer.announce(PeerState.ONLINE)  # the plan followed, at once
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
