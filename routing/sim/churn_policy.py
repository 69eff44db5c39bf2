"""Who serves which layers while peers come and go: the interface of the churn benchmark's policies,
and hexswarm's coordinator as one of them.

A policy sees the swarm (`SwarmView`) at every join or leave and every few seconds, and answers
with the peers whose range changes (`Decision`). The simulator (`churn_sim.py`) applies the
changes: a peer that gets a new range loads it (`moves.load_seconds`) and serves nothing meanwhile.
The interface is this one method so that the live coordinator's own decision logic can be
plugged in later.

* `CoordinatorPolicy` — hexswarm's coordinator: after a join or leave it waits `debounce_s` (a
  burst of events makes one re-plan), and it re-plans every `period_s` anyway, then re-opening
  one region in turn; each re-plan is `replan.replan` (the genetic search warm-started, moves
  costed), published only when its estimate beats the current plan's by the margin. Peers the
  plan leaves out keep their range.

The baselines it is compared with, Petals' rule and no re-planning, are
`routing/baselines/petals_policy.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.plan import Plan
from hexswarm.routing.scheduler.replan.moves import Assignment, MoveCosts
from hexswarm.routing.scheduler.replan.replan import REPLAN_CONFIG, plan_assignments, replan
from hexswarm.routing.sim.span_chains import PeerSpan


@dataclass(frozen=True)
class SwarmView:
    """What a policy sees: the peers present, the ranges they hold, and what changed since."""

    now_s: float
    cluster: Cluster  # the present peers' devices
    machines: Mapping[str, tuple[str, ...]]  # present peer -> its device ids
    spans: Mapping[str, PeerSpan]  # present peers' ranges (loading or serving)
    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    loaded: frozenset[str] = frozenset()  # present peers whose range is loaded (serving)


@dataclass(frozen=True)
class Decision:
    spans: dict[str, PeerSpan] = field(default_factory=dict)  # peers whose range changes
    replan_s: float | None = None  # wall time of a re-plan made for this decision
    replan_cpu_s: float | None = None  # its CPU time
    full_reload: frozenset[str] = frozenset()  # changed peers that reload every layer (Petals restarts)


class Policy(Protocol):
    name: str

    def decide(self, view: SwarmView) -> Decision: ...


def plan_spans(cluster: Cluster, plan: Plan) -> dict[str, PeerSpan]:
    """Peer -> range under a plan (one stage per machine), for the peers present in `cluster`."""
    return {
        machine: PeerSpan(machine, stage.device_ids, stage.start, stage.end)
        for machine, stage in plan_assignments(cluster, plan).items()
    }


class CoordinatorPolicy:
    """hexswarm's coordinator (module docstring)."""

    name = "coordinator"

    def __init__(
        self,
        model: ModelSpec,
        workload: Workload,
        initial: Plan,
        costs: MoveCosts | None = None,
        config=REPLAN_CONFIG,
        debounce_s: float = 20.0,
        period_s: float = 120.0,
        reopen_regions: int = 1,
    ):
        self.model, self.workload, self.costs, self.config = model, workload, costs or MoveCosts(), config
        self.plan, self.debounce_s, self.period_s = initial, debounce_s, period_s
        self.pending: float | None = None
        self.last = 0.0
        self.known: frozenset[str] = frozenset()
        self.cache: dict = {}
        self.started = False
        self.turn = 0  # the region a periodic re-plan re-opens next
        self.reopen_regions = reopen_regions  # how many regions a periodic re-plan re-opens

    def decide(self, view: SwarmView) -> Decision:
        if not self.started:  # t = 0: the initial plan, searched before the run
            self.started, self.known = True, frozenset(view.cluster.ids)
            return Decision(plan_spans(view.cluster, self.plan))
        if view.joined or view.left:
            self.pending = view.now_s if self.pending is None else self.pending
        due = self.pending is not None and view.now_s >= self.pending + self.debounce_s
        periodic = view.now_s >= self.last + self.period_s
        if not due and not periodic:
            return Decision()
        reopen = ()
        if periodic and not due:  # re-open one region in turn (`replan.replan`)
            regions = sorted({d.region for d in view.cluster.devices})
            count = min(self.reopen_regions, len(regions))
            reopen = tuple(regions[(self.turn + k) % len(regions)] for k in range(count))
            self.turn += count
        current = {m: Assignment(s.device_ids, s.start, s.end) for m, s in view.spans.items()}
        result = replan(
            view.cluster,
            self.model,
            self.workload,
            self.plan,
            self.config,
            self.costs,
            current=current,
            known=self.known,
            layout_cache=self.cache,
            reopen=reopen,
        )
        self.pending, self.last, self.known = None, view.now_s, frozenset(view.cluster.ids)
        if not result.publish:
            return Decision(replan_s=result.elapsed_s, replan_cpu_s=result.cpu_s)
        self.plan = result.plan
        spans = plan_spans(view.cluster, result.plan)
        changes = {m: s for m, s in spans.items() if view.spans.get(m) != s}
        return Decision(changes, result.elapsed_s, result.cpu_s)
