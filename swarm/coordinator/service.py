"""The coordinator's loop: hold the lease, watch the peer records, re-plan, publish plans.

The decisions are the pure parts (`triggers`, `planner`, `moves`); this module only reads
and writes the DHT around them. The search runs in a worker thread, so a peer that hosts a
coordinator (`run-peer --coordinator`) keeps serving while it plans.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field, replace

from hivemind.utils import get_dht_time

from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.plan import Plan
from hexswarm.routing.scheduler.search.genetic import SearchConfig
from hexswarm.routing.scheduler.search.search_result import NoFeasiblePlanError
from hexswarm.swarm.coordinator.lease import LeaseKeeper
from hexswarm.swarm.coordinator.moves import Placement, diff
from hexswarm.swarm.coordinator.nudges import Nudge, NudgeInbox, send_nudges
from hexswarm.swarm.coordinator.planner import (
    Planned,
    choose_planned,
    compute_disaggregated_plan,
    compute_plan,
)
from hexswarm.swarm.coordinator.records import (
    Assignment,
    PlanRecord,
    Trust,
    inputs_hash,
    plan_key,
    read_coordination,
    uncovered_text,
)
from hexswarm.swarm.coordinator.triggers import ReplanPolicy, ReplanTrigger, beats
from hexswarm.swarm.net.dialing import Dialer
from hexswarm.swarm.net.identity import Identity
from hexswarm.swarm.tools.terminal_text import printable
from hexswarm.swarm.trust import speed_reports
from hexswarm.swarm.trust.record_window import RecordWindow
from hexswarm.swarm.trust.records import (
    PeerRecord,
    PeerState,
    block_ranges,
    online_peers_per_block,
)

logger = logging.getLogger(__name__)

# Record shards the lease holder reads each watch period: every shard each 4 periods (4 s at
# the default 1 s), so that a leave is seen within 4 s and covered again within 10 s (a peer
# reads 2 a period). These searches cost each idle peer of 12 about 1% of a core
# (benchmarks/swarm_idle.py --coordinator), and itself ~8%; 4 shards a second halved that, but a
# leave then took up to 8 s to see, and the SmolLM2 swarm of test_real_model.py was covered
# again 12.6 s after a peer left, past the 10 s the coordinator's recovery must keep
# (docs/architecture.md, "The control plane's costs").
WATCH_SHARDS = 8
REPORTER_GROUPS_TIMEOUT_S = 5.0  # the daemon answers a list of its connections in milliseconds


@dataclass(frozen=True)
class CoordinatorConfig:
    model_id: str
    model: ModelSpec  # the scheduler's view of the model
    workload: Workload = field(default_factory=Workload)
    search: SearchConfig = field(
        default_factory=lambda: SearchConfig(time_budget_s=5.0, stall_generations=30)
    )
    policy: ReplanPolicy = field(default_factory=ReplanPolicy)
    lease_ttl: float = 30.0  # seconds a lease claim lives without renewal
    period: float = 5.0  # seconds between lease renewals (and re-stores of the plan)
    watch_period: float = 1.0  # seconds between reads of the peer records (a leave is seen this soon)
    trust: Trust = None  # the other candidates it competes with (records.py); None: any
    # Also plan prefill and decode replicas (HexGen-2), kept where they serve more than HexGen's plan
    disaggregated: bool = False
    force_disaggregated: bool = False  # with `disaggregated`: keep them wherever the swarm can be split

    @property
    def plan_ttl(self) -> float:
        """Plans are re-stored every step and live a few lease lifetimes, then vanish with their author."""
        return 3 * self.lease_ttl


class Coordinator:
    """One candidate coordinator of one model."""

    def __init__(self, dht, identity: Identity, config: CoordinatorConfig, inbox: NudgeInbox | None = None):
        self.dht, self.identity, self.config = dht, identity, config
        self.inbox = inbox  # the plan nudges of the auto peer this candidate runs beside, if any
        self.nudging: asyncio.Task | None = None  # telling auto peers of the newest plan
        self.me = identity.peer_id.to_base58()
        self.lease = LeaseKeeper(
            dht, identity, config.model_id, config.lease_ttl, config.period, config.trust
        )
        self.trigger = ReplanTrigger(config.policy, time.monotonic())
        self.acting = False  # planning as the lease holder (since the lease was last taken)
        self.published: PlanRecord | None = None  # our newest plan
        self.scheduler_plan: Plan | None = None  # its scheduler plan, to warm-start the next search
        self.replan_seconds: deque[float] = deque(maxlen=100)  # recent search times, for logs
        self.flagged: dict[str, speed_reports.Observed] = {}  # over-announcers, as last logged
        self.lost: tuple[int, ...] = ()  # blocks no live peer serves, as last seen
        self.stored_at = -math.inf  # when the published plan was last (re-)stored
        self.observed: dict[str, speed_reports.Observed] = {}  # clients' observed speeds, as last read
        self.observed_at = -math.inf
        # the DHT's shared p2p handle (hivemind caches it; its owner closes it): whose connections
        # place speed reporters in IP groups
        self.p2p = None
        self.dialer: Dialer | None = None  # for nudges, at the addresses the records announce
        self.window: RecordWindow | None = None  # the records as this holder follows them

    async def run(self, stop: asyncio.Event) -> None:
        """Renews the lease and plans, in two loops: a long search must never delay a renewal."""
        logger.info("coordinator candidate %s for %s", self.me, self.config.model_id)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._every(self.lease.step, stop, self.config.period))
            group.create_task(self._every(self.step, stop, min(self.config.watch_period, self.config.period)))
        if self.nudging is not None:
            self.nudging.cancel()
        await self.lease.release()  # a clean stop: a standby takes over without waiting for expiry

    async def _every(self, step, stop: asyncio.Event, period: float) -> None:
        while not stop.is_set():
            try:
                await step()
            except Exception:  # one bad step (a DHT hiccup) must not end the coordinator
                logger.exception("coordinator step failed")
            try:
                await asyncio.wait_for(stop.wait(), period)
            except TimeoutError:
                pass

    async def step(self) -> None:
        """One planning step; does nothing unless this candidate holds the lease."""
        if not self.lease.holding:
            self.acting, self.published = False, None
            return
        if not self.acting:  # a new holder reads the whole swarm, then follows it a window at a time
            self.window = RecordWindow.of(self.dht, self.config.model_id, WATCH_SHARDS, records_per_read=None)
        records = await self._live_records()
        now = time.monotonic()
        if not self.acting:  # a new holder re-plans at once, continuing the version sequence
            self.acting = True
            self.trigger = ReplanTrigger(self.config.policy, now)
            self.trigger.force("took the lease", now)
        self.trigger.observe(_view(records), now)
        self._replan_at_once_if_blocks_were_lost(records, now)
        reason = self.trigger.due(now)
        if reason is not None:
            await self._replan(records, reason)
            self.trigger.planned(time.monotonic())
        if self.published is not None and self.lease.holding and now - self.stored_at >= self.config.period:
            await self._store(self.published)  # refresh its expiration
            self.stored_at = now

    def _replan_at_once_if_blocks_were_lost(self, records: list[PeerRecord], now: float) -> None:
        """A leave that takes the last peer of some blocks skips the debounce: clients are
        waiting for those blocks now (a burst of joins can wait for the quiet)."""
        if self.published is None or self.published.missing:
            self.lost = ()
            return
        counts = online_peers_per_block(records, self.config.model.num_layers)
        lost = tuple(block for block, n in enumerate(counts) if n == 0)
        if set(lost) - set(self.lost):
            self.trigger.force(f"blocks {block_ranges(list(lost))} lost their last peer", now)
        self.lost = lost

    async def _live_records(self) -> list[PeerRecord]:
        records = await self.window.records()  # each shard read every 8 watch periods (8 s)
        # Peers that have not measured themselves yet (throughput 0) are planned once they have.
        live = [r for r in records if r.state != PeerState.LEAVING and r.throughput > 0]
        return await self._as_observed(live)

    async def _as_observed(self, records: list[PeerRecord]) -> list[PeerRecord]:
        """`records`, each peer that announces itself over twice as fast as clients observe it
        slowed to what they observe (swarm/trust/speed_reports.py), logged once per peer and figure."""
        now = time.monotonic()
        if (
            now - self.observed_at >= self.config.period
        ):  # clients publish every 30 s: no need to read each watch step
            groups = await self._reporter_groups()
            entries = await asyncio.to_thread(
                speed_reports.read, self.dht, self.config.model_id, None, groups
            )
            self.observed, self.observed_at = speed_reports.combine(entries, groups), now
        observed = self.observed
        for record in records:
            figure = speed_reports.over_announced(record, observed)
            if figure is not None and self.flagged.get(record.peer_id) != figure:
                self.flagged[record.peer_id] = figure
                logger.warning(
                    "peer %s announces %.3g ms per block, %d clients (%d proven IP groups) observe %.3g: "
                    "planning it at %.3g",
                    printable(record.name) or record.peer_id[-8:],
                    record.decode_ms_per_block,
                    figure.reporters,
                    figure.groups,
                    figure.ms_per_block,
                    speed_reports.planned_ms(record.decode_ms_per_block, figure),
                )
        return speed_reports.as_observed(records, observed)

    async def _reporter_groups(self) -> dict[str, str]:
        """Reporter id -> the IP group of this node's connection with it: what reporters prove
        (swarm/trust/speed_reports.py); none when the daemon does not answer in time."""
        try:
            p2p = await self._p2p()
            return await asyncio.wait_for(speed_reports.connected_groups(p2p), REPORTER_GROUPS_TIMEOUT_S)
        except Exception as e:  # no groups: every reporter is one unproven vote
            logger.debug("placing speed reporters in IP groups: %s: %s", type(e).__name__, e)
            return {}

    async def _p2p(self):
        if self.p2p is None:
            self.p2p = await asyncio.wait_for(self.dht.replicate_p2p(), REPORTER_GROUPS_TIMEOUT_S)
        return self.p2p

    def _tell_auto_peers(self, plan: PlanRecord, records: list[PeerRecord]) -> None:
        """Tells each auto peer that `plan` is out (swarm/coordinator/nudges.py), in the
        background: slow dials must not hold up the next step. A newer plan's nudges replace
        those of an older one still being sent."""
        if self.nudging is not None:
            self.nudging.cancel()
        auto = [r for r in records if r.auto and r.peer_id != self.me]
        if self.inbox is not None and any(r.peer_id == self.me and r.auto for r in records):
            self.inbox.take_local(Nudge(plan.model_id, plan.version))
        self.nudging = asyncio.create_task(self._nudge(Nudge(plan.model_id, plan.version), auto))

    async def _nudge(self, nudge: Nudge, peers: list[PeerRecord]) -> None:
        try:
            if self.dialer is None:
                self.dialer = Dialer(await self._p2p())
            self.dialer.learn(peers)
            told = await send_nudges(self.dialer.open_stream, [r.peer_id for r in peers], nudge)
            logger.info("told %d of %d auto peers that plan v%d is out", told, len(peers), nudge.version)
        except Exception as e:  # they read the plan every 4th announce period anyway
            logger.warning("telling auto peers of plan v%d failed: %s", nudge.version, type(e).__name__)

    async def _replan(self, records: list[PeerRecord], reason: str) -> None:
        c = self.config
        began = time.perf_counter()
        try:
            planned = await asyncio.to_thread(self._plan, where_bound(records, self.published))
        except NoFeasiblePlanError as e:
            logger.info("re-plan (%s): nothing to plan: %s", reason, e)
            return
        self.replan_seconds.append(time.perf_counter() - began)
        coordination = await read_coordination(self.dht, c.model_id, self.lease.trust)
        current = self.published
        alive = {r.peer_id for r in records}
        still_valid = current is not None and all(a.peer_id in alive for a in current.assignments)
        estimate = (planned.attainment, planned.throughput_tok_s)
        if not planned.covers:
            warn_uncovered(c.model_id, planned)
        newly_covers = planned.covers and current is not None and bool(current.missing)
        if (
            still_valid
            and not newly_covers
            and not first_split(current, planned, c.force_disaggregated)
            and not beats(estimate, (current.attainment, current.throughput_tok_s), c.policy)
        ):
            logger.info(
                "re-plan (%s): kept plan v%d (new estimate %.1f%% / %.0f tok/s does not beat %.1f%% / %.0f tok/s)",
                reason,
                current.version,
                100 * planned.attainment,
                planned.throughput_tok_s,
                100 * current.attainment,
                current.throughput_tok_s,
            )
            return
        if not self.lease.holding:
            logger.info("re-plan (%s): lost the lease while searching; not publishing", reason)
            return
        version = max(coordination.newest_version, current.version if current else 0) + 1
        record = plan_record(self.config.model_id, self.me, records, planned, version, c.workload.objective)
        moves = diff({r.peer_id: Placement.of(r) for r in records if r.auto}, planned.assignments)
        await self._store(record)
        self.published, self.scheduler_plan = record, planned.plan or self.scheduler_plan
        self._tell_auto_peers(record, records)
        logger.info(
            "published plan v%d (%s): %d peers, %d moves, estimate %s, %.0f tok/s, searched in %.1f s",
            version,
            reason,
            len(record.assignments),
            len(moves),
            f"{100 * planned.attainment:.1f}% attainment" if c.workload.has_deadline else "(no deadline)",
            planned.throughput_tok_s,
            self.replan_seconds[-1],
        )

    def _plan(self, records: list[PeerRecord]) -> Planned:
        """HexGen's plan (what `compute_plan` gives); when disaggregated, HexGen-2's roles and
        ranges instead where the swarm can be split so and they serve more tokens/s
        (`choose_planned`; forced: wherever it can be split)."""
        c = self.config
        if not c.disaggregated:
            return compute_plan(records, c.model, c.workload, c.search, self.scheduler_plan)
        try:
            disaggregated = compute_disaggregated_plan(records, c.model, c.workload, c.search.time_budget_s)
        except NoFeasiblePlanError as e:
            logger.warning("no disaggregated plan for these peers (%s); planning them colocated", e)
            return compute_plan(records, c.model, c.workload, c.search, self.scheduler_plan)
        if c.force_disaggregated:
            return disaggregated
        colocated = compute_plan(records, c.model, c.workload, c.search, self.scheduler_plan)
        planned, choice = choose_planned(records, c.model, c.workload, colocated, disaggregated)
        logger.info("%s: planned %s", printable(c.model_id), choice.reason)
        return planned

    async def _store(self, record: PlanRecord) -> None:
        future = self.dht.store(
            plan_key(self.config.model_id),
            record.to_bytes(),
            get_dht_time() + self.config.plan_ttl,
            subkey=self.identity.owner_marker,
            return_future=True,
        )
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), 10.0)
        except (TimeoutError, RuntimeError, OSError) as e:
            logger.warning("storing plan v%d failed: %s", record.version, type(e).__name__)


def plan_record(
    model_id: str,
    coordinator: str,
    records: list[PeerRecord],
    planned: Planned,
    version: int,
    objective: str = "slo",
) -> PlanRecord:
    """The record that publishes `planned`: each auto peer's range at its planned TP degree."""
    inputs = sorted(
        [r.peer_id, r.auto, r.start, r.end, r.tp, list(r.tp_choices), round(r.throughput, 3)] for r in records
    )
    return PlanRecord(
        model_id=model_id,
        version=version,
        coordinator=coordinator,
        inputs_hash=inputs_hash(inputs),
        attainment=planned.attainment,
        throughput_tok_s=planned.throughput_tok_s,
        assignments=tuple(
            Assignment(peer, p.start, p.end, p.tp, planned.roles.get(peer, "both"))
            for peer, p in sorted(planned.assignments.items())
        ),
        created=get_dht_time(),
        objective=objective,
        missing=planned.missing,
        memory_short_blocks=planned.memory_short_blocks,
    )


def first_split(current: PlanRecord | None, planned: Planned, forced: bool) -> bool:
    """Whether `planned` is the first plan with roles of a coordinator told to split the swarm
    (`--force-disaggregated`) whose published plan has none: that one was planned colocated while
    the swarm could not be split (one auto peer), so its estimate is of another kind of plan for
    fewer peers, and `beats` comparing the two would keep the peers unsplit for good."""
    return (
        forced
        and bool(planned.roles)
        and current is not None
        and all(a.role == "both" for a in current.assignments)
    )


def where_bound(records: list[PeerRecord], published: PlanRecord | None) -> list[PeerRecord]:
    """Each auto peer placed where it is going, which is what a move from here costs: the range
    it is loading, else the one our newest plan gives it if it has not read that plan yet.
    Planned from where peers were a second ago, two peers would be sent to swap ranges, and
    each would wait for the other to serve its old blocks (peer/range_move.py)."""
    bound = []
    for r in records:
        assignment = published.assignment_of(r.peer_id) if published is not None else None
        if r.auto and r.next_end > r.next_start:
            r = replace(r, start=r.next_start, end=r.next_end)
        elif r.auto and assignment is not None and r.plan_version < published.version:
            r = replace(r, start=assignment.start, end=assignment.end)
        bound.append(r)
    return bound


def warn_uncovered(model_id: str, planned: Planned) -> None:
    """No plan serves every block: say which blocks, and how many more the peers would need to hold."""
    advice = " (start more peers, or raise --max-blocks)" if planned.memory_short_blocks else ""
    logger.warning(
        "NO PLAN COVERS %s: %s%s",
        model_id,
        uncovered_text(planned.missing, planned.memory_short_blocks),
        advice,
    )


def _view(records: list[PeerRecord]) -> dict[str, tuple[float, bool]]:
    return {r.peer_id: (r.throughput, not r.auto) for r in records if r.throughput > 0}
