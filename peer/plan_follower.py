"""How an `--layers auto` peer decides where to serve: the coordinator's plan, or Petals' rule.

Each step the peer reads the lease and plans of its model (swarm/coordinator/records.py):

- a live lease holder with a plan newer than the one followed: take its assignment for this
  peer (plans signed by anyone else, or not newer, are ignored, and logged once);
- besides, the coordinator that publishes a plan tells each auto peer so over p2p (a nudge,
  swarm/coordinator/nudges.py), and the peer then reads the lease and plans at once: a new plan
  is followed within a second or so of being published, not an announce period later. Nudges
  replaced a watch that read the two keys every second (hivemind has no subscriptions): ~600
  searches a second at 300 auto peers, on the few nodes nearest those keys. A lost nudge costs
  time only: every PLAN_READ_PERIODS-th announce period's step reads them too. A peer that trusts no
  coordinator (`--public` without `--coordinator-key`) never reads them;
- no live holder: Petals' rule (routing/scheduler/petals_rule.py), checked (after a read of the
  lease) every `rebalance_period` seconds on average (uniform in [0, 2x], as Petals' servers do), so
  that peers that started together do not all move at once; a coordinator that appears later
  takes over at its first plan.

A move itself (load the new range while serving the old, then switch) is `Peer.move_to` in
peer/runtime.py; this module only decides.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from hexswarm.routing.scheduler.petals_rule import Span, check_delay, choose_start, should_move
from hexswarm.swarm.coordinator.nudges import NudgeInbox
from hexswarm.swarm.coordinator.records import Coordination, Trust, read_coordination, trust_text
from hexswarm.swarm.trust.records import PeerRecord, PeerState, fetch_peer_records

logger = logging.getLogger(__name__)

PLAN_READ_PERIODS = 4  # a step reads the lease and plans every 4th announce period (a minute at 15 s)


def spans_of(records: Sequence[PeerRecord], exclude: str = "") -> list[Span]:
    """Where peers serve (or, while moving, are going to serve), weighted by throughput."""
    spans = []
    for r in records:
        if r.peer_id == exclude or r.state == PeerState.LEAVING:
            continue
        start, end = (r.next_start, r.next_end) if r.next_end > r.next_start else (r.start, r.end)
        spans.append(Span(start, end - start, max(r.throughput, 1.0)))
    return spans


def initial_range(records: Sequence[PeerRecord], num_blocks: int, length: int) -> tuple[int, int]:
    """Petals' join rule: the window whose weakest blocks are weakest."""
    length = min(length, num_blocks)
    start = choose_start(num_blocks, spans_of(records), length)
    return start, start + length


def fallback_target(
    records: Sequence[PeerRecord], me: PeerRecord, num_blocks: int, rng: random.Random
) -> tuple[int, int] | None:
    """Petals' periodic check for this peer: the range to move to, or None."""
    others = spans_of(records, exclude=me.peer_id)
    spans = [*others, Span(me.start, me.end - me.start, max(me.throughput, 1.0))]
    start = should_move(num_blocks, spans, len(spans) - 1, rng=rng)
    return None if start is None else (start, start + me.end - me.start)


def old_range_covered(
    records: Sequence[PeerRecord], me: str, old: tuple[int, int], new: tuple[int, int]
) -> bool:
    """Whether every block of `old` is served by another online peer or by `new` (safe to drop)."""
    return all(new[0] <= block < new[1] or _online_elsewhere(records, me, block) for block in range(*old))


def goes_first_in_a_swap(
    records: Sequence[PeerRecord], me: str, old: tuple[int, int], new: tuple[int, int]
) -> bool:
    """Whether this peer should switch to `new` although blocks of `old` have no other peer:
    every such block is being loaded by a peer that, in turn, waits for `new` to cover its own
    old blocks (a swap, which make-before-break alone would hold up for --move-wait). The
    lowest peer id of the cycle goes first; the others follow once it serves `new`."""
    mine = next((r for r in records if r.peer_id == me), None)
    if mine is None:
        return False
    loaders: dict[str, PeerRecord] = {}
    for block in range(*old):
        if new[0] <= block < new[1] or _online_elsewhere(records, me, block):
            continue
        loader = next((r for r in records if r.peer_id != me and r.next_start <= block < r.next_end), None)
        if loader is None:
            return False
        loaders[loader.peer_id] = loader
    if not loaders:
        return False
    after_me = [
        replace(mine, start=new[0], end=new[1], state=PeerState.ONLINE) if r.peer_id == me else r
        for r in records
    ]
    for loader in loaders.values():
        its_move = loader.peer_id, (loader.start, loader.end), (loader.next_start, loader.next_end)
        if old_range_covered(records, *its_move) or not old_range_covered(after_me, *its_move):
            return False  # it does not wait for us: let it switch first
    return me < min(loaders)


def _online_elsewhere(records: Sequence[PeerRecord], me: str, block: int) -> bool:
    return any(r.peer_id != me and r.state == PeerState.ONLINE and r.start <= block < r.end for r in records)


def planned_degree(planned: int, me: PeerRecord) -> int:
    """The degree to serve at: the plan's if this peer offers it (`--tp auto`), else its own."""
    if planned != me.tp and planned not in me.tp_choices:
        if me.tp_choices:
            logger.warning(
                "the plan's tp %d is not one of this peer's %s; keeping tp %d", planned, me.tp_choices, me.tp
            )
        return me.tp
    return planned


class PlanFollower:
    """Decides this auto peer's moves; `move(start, end, tp)` carries one out (tp None: keep
    the degree)."""

    def __init__(
        self,
        dht,
        peer_id: str,
        model_id: str,
        num_blocks: int,
        move: Callable[[int, int, int | None], Awaitable[None]],
        rebalance_period: float,
        seed: int | None = None,
        trust: Trust = None,
        take_role: Callable[[str], None] | None = None,
    ):
        self.dht, self.peer_id, self.model_id, self.num_blocks = dht, peer_id, model_id, num_blocks
        self.move = move
        self.take_role = take_role  # a `--role auto` peer takes the role its assignment names
        self.rebalance_period = rebalance_period
        self.rng = random.Random(seed)
        self.trust = trust
        self.followed = 0  # version of the plan followed (0: none)
        self.followed_from = ""  # ... and the coordinator that signed it
        logger.info("%s: follows the plans of %s", model_id, trust_text(trust))
        self.next_check = 0.0
        self.steps = 0  # announce periods stepped
        self._ignored: set[tuple[str, int]] = set()
        self.inbox = NudgeInbox(model_id, trust, lambda: self.followed)  # "a new plan is out"

    @property
    def trusts_none(self) -> bool:
        return self.trust is not None and not self.trust

    async def _read(self, every_node: bool = True) -> Coordination:
        if self.trusts_none:
            return Coordination(None, None, 0)
        return await read_coordination(self.dht, self.model_id, self.trust, every_node)

    async def step(self, records: Sequence[PeerRecord], me: PeerRecord, now: float) -> None:
        """Each announce period: reads the lease and plans at the first step, every
        PLAN_READ_PERIODS-th after it and whenever Petals' rule is due, and follows the holder's
        plan, or applies the rule where none holds the lease. Nudges bring a new plan sooner;
        these reads catch a lost nudge and a lease gone. Each is a search that every node of a
        beam answers: read every period by every auto peer, they were most of an idle peer's
        DHT calls."""
        self.steps += 1
        if now < self.next_check and (self.steps - 1) % PLAN_READ_PERIODS:
            return
        coordination = await self._read()
        self._log_ignored(coordination)
        if coordination.holder is not None:
            await self._follow(coordination, me)
        elif now >= self.next_check:
            self.next_check = now + check_delay(self.rng, self.rebalance_period)  # Petals' uniform wait
            target = fallback_target(records, me, self.num_blocks, self.rng)
            if target is not None:
                logger.info("no live coordinator: Petals' rule moves this peer to [%d:%d)", *target)
                await self.move(*target, None)

    async def follow_newer(self, me: PeerRecord) -> bool:
        """Follows the lease holder's plan at once if it is newer than the one followed (the
        peer's plan watch, when nudged); True if it did. It asks only the nodes nearest each
        key (swarm/net/dht_read.py): it acts only on a newer plan, and `step` (each announce
        period, every node's answer) is what acts on a lease gone."""
        coordination = await self._read(every_node=False)
        return coordination.holder is not None and await self._follow(coordination, me)

    async def _follow(self, coordination: Coordination, me: PeerRecord) -> bool:
        """Takes the holder's plan if it is newer than the one followed; True if it did."""
        plan = coordination.plan
        # Versions order one coordinator's plans; a new holder's newest plan is followed even
        # if it is numbered lower than its predecessor's (which it cannot have read in time).
        if plan is not None and plan.coordinator != self.followed_from:
            self.followed = 0
        if plan is None or plan.version <= self.followed:
            if (
                plan is not None
                and plan.version < self.followed
                and (plan.coordinator, plan.version) not in self._ignored
            ):
                self._ignored.add((plan.coordinator, plan.version))
                logger.warning("ignoring stale plan v%d: following v%d already", plan.version, self.followed)
            return False
        assignment = plan.assignment_of(self.peer_id)
        logger.info("following plan v%d of coordinator %s", plan.version, plan.coordinator[-8:])
        self.followed, self.followed_from = plan.version, plan.coordinator
        if assignment is None:
            return True
        if self.take_role is not None:
            self.take_role(assignment.role)
        tp = planned_degree(assignment.tp, me)
        if (assignment.start, assignment.end, tp) != (me.start, me.end, me.tp):
            await self.move(assignment.start, assignment.end, tp)
        return True

    def _log_ignored(self, coordination: Coordination) -> None:
        for plan in coordination.others:
            if (plan.coordinator, plan.version) not in self._ignored:
                self._ignored.add((plan.coordinator, plan.version))
                # a plan no newer than the one followed is a previous coordinator's (a handover);
                # a newer one from a non-holder is worth a warning
                previous = plan.version <= self.followed
                (logger.info if previous else logger.warning)(
                    "ignoring plan v%d signed by %s: it does not hold the coordinator lease%s",
                    plan.version,
                    plan.coordinator[-8:],
                    " (a previous coordinator's)" if previous else "",
                )


async def join_range(dht, model_id: str, num_blocks: int, max_blocks: int) -> tuple[int, int]:
    """Where an auto peer starts: Petals' join rule over the records announced right now."""
    records = await fetch_peer_records(dht, model_id)
    return initial_range(records, num_blocks, max_blocks or num_blocks)


def follower_trust(named: Trust, runs_coordinator: bool, peer_id: str) -> Trust:
    """Whose plans an auto peer follows: the `named` coordinator keys, and its own coordinator
    candidate's when it runs one (`--coordinator` runs it with the peer's key, which trusts
    itself)."""
    return named | {peer_id} if named is not None and runs_coordinator else named
