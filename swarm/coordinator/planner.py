"""One call into the scheduler: peer records in, per-peer assignments and an estimate out.

This is the single place where the coordinator calls the scheduler: `routing.scheduler.replan`,
HexGen's genetic search (§4.3) warm-started from the previous plan, with the swarm's rules:

- one scheduler device per peer (`cluster_view.py`) and `one_stage_per_machine`, so a stage is
  one peer (one process, one TP group);
- fixed (`--layers A:B`) peers are pinned stages: planned around (the search may complete
  pipelines through them), never moved;
- each peer that a candidate plan moves is charged the time to load its new layers, and the
  plan is valued by its attainment over a horizon with those loads (`replan.py`), so among
  equally good plans the one with the fewest moves wins;
- when the peers cannot hold a replica, Petals' rule places the auto peers one by one around
  the fixed ones (`routing/scheduler/petals_rule.py`), with no estimate (0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from routing.scheduler.genetic import NoFeasiblePlanError, SearchConfig
from routing.scheduler.model_spec import ModelSpec, Workload
from routing.scheduler.moves import Assignment
from routing.scheduler.petals_rule import Span, choose_start
from routing.scheduler.plan import Plan, StagePlan
from routing.scheduler.replan import MoveCosts, replan
from swarm.coordinator.cluster_view import build_view
from swarm.coordinator.moves import Range, rematch
from swarm.records import PeerRecord


@dataclass(frozen=True)
class Planned:
    """What a re-plan produced."""

    assignments: dict[str, Range]  # auto peer id -> its range
    attainment: float
    throughput_tok_s: float
    plan: Plan | None  # the scheduler's plan (to warm-start the next search); None from the fallback


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
    pinned = [StagePlan((r.peer_id,), r.start, r.end) for r in fixed]
    current = {r.peer_id: Assignment((r.peer_id,), r.start, r.end) for r in auto}
    swarm_config = replace(config, one_stage_per_machine=True)
    try:
        result = replan(cluster, model, workload, previous, swarm_config, costs or MoveCosts(), pinned, current)
    except NoFeasiblePlanError:
        return Planned(petals_placement(auto, fixed, model.num_layers), 0.0, 0.0, None)
    auto_ids = {r.peer_id for r in auto}
    placed = {
        stage.device_ids[0]: (stage.start, stage.end)
        for pipeline in result.plan.pipelines
        for stage in pipeline.stages
        if stage.device_ids[0] in auto_ids
    }
    ranges = {peer: (a.start, a.end) for peer, a in current.items()}
    estimate = result.plan.estimate
    return Planned(
        rematch(placed, ranges, [d for d in cluster.devices if d.id in auto_ids]),
        estimate.attainment if estimate else 0.0,
        estimate.throughput_tok_s if estimate else 0.0,
        result.plan,
    )


def block_capacity(record: PeerRecord, num_blocks: int) -> int:
    """How many blocks a peer takes under Petals' rule: its stated maximum, else its current span."""
    return min(num_blocks, record.max_blocks or max(record.end - record.start, 1))


def petals_placement(
    auto: Sequence[PeerRecord], fixed: Sequence[PeerRecord], num_blocks: int
) -> dict[str, Range]:
    """Petals' join rule applied to the auto peers one by one, strongest first, around the fixed ones."""
    spans = [Span(r.start, r.end - r.start, r.throughput) for r in fixed]
    placed: dict[str, Range] = {}
    for r in sorted(auto, key=lambda r: (-r.throughput, r.peer_id)):
        length = block_capacity(r, num_blocks)
        start = choose_start(num_blocks, spans, length)
        spans.append(Span(start, length, max(r.throughput, 1e-3)))
        placed[r.peer_id] = (start, start + length)
    return placed
