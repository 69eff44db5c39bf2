"""One call into the scheduler: peer records in, per-peer placements and an estimate out.

This is the single place where the coordinator calls the scheduler: `routing.scheduler.replan.replan`,
HexGen's genetic search (§4.3) warm-started from the previous plan, with the swarm's rules:

- a peer is one machine of the scheduler's cluster (`cluster_view.py`) and the search runs with
  `one_stage_per_machine`, so a stage is one peer (one process, one TP group on one machine of
  one GPU type, HexGen §4.2); a peer that offers TP degrees is several devices there, and the
  degree of its stage (how many of them it uses) is the degree the plan gives it;
- fixed (`--layers A:B`) peers are pinned stages: planned around (the search may complete
  pipelines through them), never moved; an auto peer that offers no degrees keeps its `tp`;
- each peer that a candidate plan moves is charged the time to load its new layers (all of them
  when its degree changes), and the plan is valued by its attainment over a horizon with those
  loads (`replan.py`), so among equally good plans the one with the fewest moves wins;
- the deadline is `slo_scale` times the swarm's own latency (one request through the whole
  model on its fastest peer alone, `cost_model.swarm_reference_latency`), not HexGen's A100
  unit, which a CPU or consumer-GPU swarm never meets: every plan would score 0 and the search
  could not tell a plan that serves the model from one that does not;
- spare memory serves blocks a second time: each auto peer's range is widened, within what it
  holds, toward blocks served once (`redundancy.py`), so one leave uncovers nothing where the
  swarm can hold the model twice;
- coverage is a hard constraint, checked before any objective: if the search's placements leave
  a block unserved while Petals' rule would cover the model, Petals' rule is used (with no
  estimate, 0); when nothing covers the model, `Planned.missing` names the blocks and
  `memory_short_blocks` how many more blocks the peers would need to hold;
- when the peers cannot hold a replica, Petals' rule places the auto peers one by one around
  the fixed ones (`routing/scheduler/petals_rule.py`) at their current degrees, with no
  estimate (0).

With `--disaggregated` the coordinator also plans HexGen-2's prefill and decode replicas
(`compute_disaggregated_plan`) and keeps whichever of the two serves more tokens/s on one
simulated trace of its workload (`choose_planned`, `routing/disaggregation/choice.py`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import swarm_reference_latency
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.petals_rule import Span, choose_start
from hexswarm.routing.scheduler.plan import Plan, StagePlan
from hexswarm.routing.scheduler.replan.moves import Assignment, MoveCosts
from hexswarm.routing.scheduler.replan.replan import replan
from hexswarm.routing.scheduler.search.genetic import SearchConfig
from hexswarm.routing.scheduler.search.search_result import NoFeasiblePlanError
from hexswarm.swarm.coordinator.cluster_view import (
    build_view,
    capacity_blocks,
    degree_choices,
    device_ids,
    peer_of,
    serving_ids,
    stage_degree,
)
from hexswarm.swarm.coordinator.moves import Placement, kind_of, rematch
from hexswarm.swarm.coordinator.redundancy import served_counts, widen
from hexswarm.swarm.trust.records import PeerRecord

if TYPE_CHECKING:
    from hexswarm.routing.disaggregation.choice import Choice
    from hexswarm.routing.disaggregation.plan_record import DisaggregatedPlan


@dataclass(frozen=True)
class Planned:
    """What a re-plan produced."""

    assignments: dict[str, Placement]  # auto peer id -> its range and TP degree
    attainment: float
    throughput_tok_s: float
    plan: Plan | None  # the scheduler's plan (to warm-start the next search); None from the fallback
    missing: tuple[int, ...] = ()  # blocks no peer serves under this plan (empty: it covers the model)
    memory_short_blocks: int = 0  # blocks more than the peers can hold in all, when it cannot cover
    roles: dict[str, str] = field(default_factory=dict)  # auto peer id -> prefill or decode (disaggregated)
    disaggregated: DisaggregatedPlan | None = None  # HexGen-2's plan, when this is one (to score it)

    @property
    def covers(self) -> bool:
        return not self.missing


def compute_plan(
    records: Sequence[PeerRecord],
    model: ModelSpec,
    workload: Workload,
    config: SearchConfig,
    previous: Plan | None = None,
    costs: MoveCosts | None = None,
) -> Planned:
    """Plans the auto peers of `records` around the fixed ones; raises NoFeasiblePlanError if
    there are no auto peers."""
    auto = [r for r in records if r.auto]
    if not auto:
        raise NoFeasiblePlanError("no --layers auto peers to plan")
    fixed = [r for r in records if not r.auto]
    cluster = build_view(records, model, workload)
    if workload.has_deadline and workload.reference_s is None:
        reference = swarm_reference_latency(cluster, model, float(workload.s_in), workload.s_out)
        workload = replace(workload, reference_s=reference)
    pinned = [StagePlan((r.peer_id,), r.start, r.end, r.quant) for r in fixed]
    current = {r.peer_id: Assignment(serving_ids(r), r.start, r.end) for r in auto}
    swarm_config = replace(config, one_stage_per_machine=True)
    try:
        result = replan(
            cluster, model, workload, previous, swarm_config, costs or MoveCosts(), pinned, current
        )
    except NoFeasiblePlanError:
        return with_second_copies(covering(None, auto, fixed, model.num_layers), auto, fixed, model, workload)
    estimate = result.plan.estimate
    serving = {r.peer_id: Placement.of(r) for r in auto}
    searched = Planned(
        rematch(placements(result.plan, auto), serving, kinds(cluster, auto)),
        estimate.attainment if estimate else 0.0,
        estimate.throughput_tok_s if estimate else 0.0,
        result.plan,
    )
    return with_second_copies(covering(searched, auto, fixed, model.num_layers), auto, fixed, model, workload)


def with_second_copies(
    planned: Planned,
    auto: Sequence[PeerRecord],
    fixed: Sequence[PeerRecord],
    model: ModelSpec,
    workload: Workload,
) -> Planned:
    """`planned` with each auto peer's range widened, within its memory, so that blocks are
    served twice where the swarm can hold them twice (`redundancy.py`)."""
    by_id = {r.peer_id: r for r in auto}
    ranges = {peer: (p.start, p.end) for peer, p in planned.assignments.items()}
    capacity = {
        peer: max(capacity_blocks(by_id[peer], model, workload, p.tp), p.end - p.start)
        for peer, p in planned.assignments.items()
    }
    widened = widen(ranges, capacity, [(r.start, r.end) for r in fixed], model.num_layers)
    assignments = {
        peer: p._replace(start=widened[peer][0], end=widened[peer][1])
        for peer, p in planned.assignments.items()
    }
    missing = uncovered(assignments, fixed, model.num_layers)
    short = planned.memory_short_blocks if missing else 0
    return replace(planned, assignments=assignments, missing=missing, memory_short_blocks=short)


def compute_disaggregated_plan(
    records: Sequence[PeerRecord], model: ModelSpec, workload: Workload, budget_s: float
) -> Planned:
    """HexGen-2's plan (§3) for the auto peers: each replica's stages become the ranges of its
    peers, and its role theirs. Raises NoFeasiblePlanError when the auto peers cannot form a
    prefill and a decode replica that each cover the model (fixed peers are left as they are,
    serving whole requests), so the caller plans them colocated instead."""
    from hexswarm.routing.disaggregation.planner import DisaggregationConfig, plan_disaggregated

    auto = {r.peer_id: r for r in records if r.auto}
    if len(auto) < 2:
        raise NoFeasiblePlanError("disaggregation needs two --layers auto peers or more")
    cluster = build_view(list(auto.values()), model, workload)
    if workload.has_deadline and workload.reference_s is None:  # the swarm's own latency (module docstring)
        reference = swarm_reference_latency(cluster, model, float(workload.s_in), workload.s_out)
        workload = replace(workload, reference_s=reference)
    config = DisaggregationConfig(time_budget_s=budget_s, whole_machines=True)
    plan = plan_disaggregated(cluster, model, workload, config).plan
    assignments, roles = {}, {}
    for replica in plan.replicas:
        for stage in replica.stages:
            peer = peer_of(stage.device_ids[0])
            tp = stage_degree(auto[peer], len(stage.device_ids))
            assignments[peer], roles[peer] = Placement(stage.start, stage.end, tp), replica.role
    by_role = {
        role: [p for peer, p in assignments.items() if roles[peer] == role] for role in ("prefill", "decode")
    }
    for role, placements_ in by_role.items():
        if not placements_ or uncovered(dict(enumerate(placements_)), [], model.num_layers):
            raise NoFeasiblePlanError(f"the {role} replicas do not cover every block")
    return Planned(assignments, 0.0, plan.throughput_tok_s, None, roles=roles, disaggregated=plan)


def choose_planned(
    records: Sequence[PeerRecord],
    model: ModelSpec,
    workload: Workload,
    colocated: Planned,
    disaggregated: Planned,
) -> tuple[Planned, Choice]:
    """Whichever of the two plans of `records` serves more tokens/s on one simulated trace of
    `workload` (`routing/disaggregation/choice.py`), both scored on the cluster of all the
    records, with why. The colocated plan is scored as the search gave it (before its ranges
    were widened into second copies); one placed by Petals' rule has no figure."""
    from hexswarm.routing.disaggregation.choice import choose

    cluster = build_view(records, model, workload)
    choice = choose(cluster, model, workload, colocated.plan, disaggregated.disaggregated)
    return (disaggregated if choice.disaggregated else colocated), choice


def covering(
    searched: Planned | None, auto: Sequence[PeerRecord], fixed: Sequence[PeerRecord], num_blocks: int
) -> Planned:
    """The searched plan if it serves every block, else Petals' rule if that does, else the one
    that leaves fewer blocks unserved, with what it misses (coverage before any objective)."""
    options = [searched] if searched is not None else []
    options.append(Planned(petals_placement(auto, fixed, num_blocks), 0.0, 0.0, None))
    options = [replace(p, missing=uncovered(p.assignments, fixed, num_blocks)) for p in options]
    best = min(options, key=lambda p: len(p.missing))  # the searched plan first among equals
    if best.covers:
        return best
    capacity = sum(block_capacity(r, num_blocks) for r in auto) + sum(r.end - r.start for r in fixed)
    return replace(best, memory_short_blocks=max(0, num_blocks - capacity))


def uncovered(
    assignments: dict[str, Placement], fixed: Sequence[PeerRecord], num_blocks: int
) -> tuple[int, ...]:
    """Blocks that neither an assignment nor a fixed peer serves."""
    spans = [(p.start, p.end) for p in assignments.values()] + [(r.start, r.end) for r in fixed]
    return tuple(block for block, n in enumerate(served_counts(spans, num_blocks)) if n == 0)


def placements(plan: Plan, auto: Sequence[PeerRecord]) -> dict[str, Placement]:
    """Auto peer -> the range of its stage in `plan` and its degree (the stage's devices)."""
    by_id = {r.peer_id: r for r in auto}
    out = {}
    for pipeline in plan.pipelines:
        for stage in pipeline.stages:
            record = by_id.get(peer_of(stage.device_ids[0]))
            if record is not None:
                tp = stage_degree(record, len(stage.device_ids))
                out[record.peer_id] = Placement(stage.start, stage.end, tp)
    return out


def kinds(cluster: Cluster, auto: Sequence[PeerRecord]) -> dict[str, Hashable]:
    """Auto peer -> its kind (`moves.kind_of`): its first device's figures and its offered degrees."""
    out: dict[str, Hashable] = {}
    for r in auto:
        representative = cluster.devices[cluster.index(device_ids(r)[0])]
        offered = r.tp_choices if degree_choices(r) else (r.tp,)
        out[r.peer_id] = kind_of(representative, offered)
    return out


def block_capacity(record: PeerRecord, num_blocks: int) -> int:
    """How many blocks a peer takes under Petals' rule: its stated maximum, else its current span."""
    return min(num_blocks, record.max_blocks or max(record.end - record.start, 1))


def petals_placement(
    auto: Sequence[PeerRecord], fixed: Sequence[PeerRecord], num_blocks: int
) -> dict[str, Placement]:
    """Petals' join rule applied to the auto peers one by one, strongest first, around the fixed
    ones; each keeps its current degree."""
    spans = [Span(r.start, r.end - r.start, r.throughput) for r in fixed]
    placed: dict[str, Placement] = {}
    for r in sorted(auto, key=lambda r: (-r.throughput, r.peer_id)):
        length = block_capacity(r, num_blocks)
        start = choose_start(num_blocks, spans, length)
        spans.append(Span(start, length, max(r.throughput, 1e-3)))
        placed[r.peer_id] = Placement(start, start + length, r.tp)
    return placed
