"""One call into the scheduler: peer records in, per-peer assignments and an estimate out.

This is the single place that calls the genetic search (HexGen §4.3), warm-started from the
previous plan, so that a later scheduler with move costs and machine constraints can replace it.
Until then the constraints are handled here, simply:

- one scheduler device per peer (`cluster_view.py`), so "a stage's devices on one machine"
  means "a stage on one peer"; a stage the search gives to several peers (tensor parallelism
  across peers, which a swarm peer cannot do) is repaired into consecutive stages, its layers
  split in proportion to the peers' memory: the same memory per peer, pipelined instead of TP;
- fixed (`--layers A:B`) peers are left out of the search: they are never moved, and their
  blocks are extra capacity the estimate does not count;
- when the auto peers cannot hold a replica on their own, Petals' rule places them one by one
  around the fixed peers (`routing/scheduler/petals_rule.py`), with no estimate (0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.scheduler.cluster import Cluster
from routing.scheduler.genetic import NoFeasiblePlanError, SearchConfig, search
from routing.scheduler.model_spec import ModelSpec, Workload
from routing.scheduler.petals_rule import Span, choose_start
from routing.scheduler.plan import Plan
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
) -> Planned:
    """Plans the auto peers of `records` around the fixed ones; raises NoFeasiblePlanError if
    there are no auto peers."""
    auto = [r for r in records if r.auto]
    if not auto:
        raise NoFeasiblePlanError("no --layers auto peers to plan")
    current = {r.peer_id: (r.start, r.end) for r in auto}
    cluster = build_view(auto, model, workload)
    try:
        result = search(cluster, model, workload, config, previous=previous)
    except NoFeasiblePlanError:
        fixed = [r for r in records if not r.auto]
        return Planned(petals_placement(auto, fixed, model.num_layers), 0.0, 0.0, None)
    placed = split_stages(result.plan, cluster)
    estimate = result.plan.estimate
    return Planned(
        rematch(placed, current, cluster.devices),
        estimate.attainment if estimate else 0.0,
        estimate.throughput_tok_s if estimate else 0.0,
        result.plan,
    )


def split_stages(plan: Plan, cluster: Cluster) -> dict[str, Range]:
    """peer id -> range; a stage over k peers becomes k consecutive stages (see module docstring)."""
    placed: dict[str, Range] = {}
    for pipeline in plan.pipelines:
        for stage in pipeline.stages:
            peers = list(stage.device_ids)
            memory = [cluster.devices[cluster.index(p)].memory_bytes for p in peers]
            bounds = _proportional_bounds(stage.start, stage.end, memory)
            for peer, (a, b) in zip(peers, bounds, strict=True):
                if b > a:
                    placed[peer] = (a, b)
    return placed


def _proportional_bounds(start: int, end: int, weights: list[float]) -> list[Range]:
    total, layers = sum(weights), end - start
    cuts, acc = [start], 0.0
    for w in weights[:-1]:
        acc += w
        cuts.append(start + round(layers * acc / total))
    cuts.append(end)
    return [(cuts[i], max(cuts[i], cuts[i + 1])) for i in range(len(weights))]


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
