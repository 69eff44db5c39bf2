"""Pinned stages: peers started with a fixed layer range, which a plan uses but never moves.

Representation: a pinned stage is a `StagePlan` (the peer's device ids, leader first, serving
the fixed layers [start, end)); `search.search(..., pinned=[...])` and `replan.replan` take a
list of them. The search plans around them in two steps:

1. *Completion.* The pinned stages are chained (a stage is followed by a pinned stage that starts
   where it ends, one of its own region first), and the gaps of each chain, [0, start) and
   [end, L), are filled with free machines: the same region first, the largest first, each machine
   one stage (its devices as one TP group of the largest power-of-two degree that fits), layers
   shared in proportion to speed under the machines' memory caps (`layer_split.balanced_split`).
   A previous plan's pipeline that holds pinned stages and is still whole is kept as it is.
   A chain whose gaps the free machines cannot fill stays out of the plan (its peers still
   serve their ranges; clients may route through them).
2. *Search.* The search that `search.search` hands in (HexGen's genetic search, §4.3, by region
   on large clusters) plans the remaining free devices as usual.

The completion is greedy, not searched: the genetic search never regroups the fillers of a
pinned chain. That keeps pinned peers' neighbours stable too, at some cost in plan quality.
"""

from __future__ import annotations

from collections.abc import Sequence

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import comp_cost, group_max_layers, tp_comm_cost
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.algorithm1 import TP_DEGREES
from hexswarm.routing.scheduler.pipeline_layout.layer_split import balanced_split
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP, PipelineLayout, StageLayout
from hexswarm.routing.scheduler.plan import Plan, StagePlan
from hexswarm.routing.scheduler.plan_eval import make_plan, plan_layouts
from hexswarm.routing.scheduler.search.search_result import NoFeasiblePlanError, Search, SearchResult
from hexswarm.routing.scheduler.simulation.fitness import pipeline_capacity
from hexswarm.routing.scheduler.simulation.serving import evaluate_layouts
from hexswarm.routing.scheduler.simulation.simulator import make_trace


def check_pinned(cluster: Cluster, num_layers: int, pinned: Sequence[StagePlan]) -> list[StagePlan]:
    """The pinned stages whose devices are all present (others have left); raises on bad ranges."""
    present, seen = [], set()
    for stage in pinned:
        if not 0 <= stage.start < stage.end <= num_layers or not stage.device_ids:
            raise ValueError(f"pinned stage {stage} is not a non-empty range within [0, {num_layers})")
        if seen & set(stage.device_ids):
            raise ValueError(f"pinned stage {stage} shares devices with another pinned stage")
        seen |= set(stage.device_ids)
        if all(d in cluster._positions for d in stage.device_ids):
            present.append(stage)
    return present


def free_devices(cluster: Cluster, pinned: Sequence[StagePlan], whole_machines: bool) -> list[int]:
    """Device indices a plan may place: not pinned, nor (in a swarm) on a pinned peer's machine."""
    fixed = {d for s in pinned for d in s.device_ids}
    machines = {cluster.devices[cluster.index(d)].machine for d in fixed if d in cluster._positions}
    return [
        i
        for i, d in enumerate(cluster.devices)
        if d.id not in fixed and not (whole_machines and d.machine in machines)
    ]


def pinned_pipelines(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    pinned: Sequence[StagePlan],
    free: Sequence[int],
    previous: Plan | None = None,
) -> tuple[list[PipelineLayout], set[int]]:
    """Completion (module docstring, step 1): pipelines through pinned stages, and the free
    device indices they took."""
    dp = PipelineDP(cluster, model, workload)
    pinned = check_pinned(cluster, model.num_layers, pinned)
    keys = {(s.device_ids, s.start, s.end) for s in pinned}
    layouts: list[PipelineLayout] = []
    used: set[int] = set()
    todo = list(pinned)
    for pipeline in previous.pipelines if previous is not None else ():
        mine = {(s.device_ids, s.start, s.end) for s in pipeline.stages} & keys
        ids = pipeline.device_ids
        if mine and all(d in cluster._positions for d in ids) and not used & {cluster.index(d) for d in ids}:
            stages = [
                StageLayout(tuple(cluster.index(d) for d in s.device_ids), s.start, s.end)
                for s in pipeline.stages
            ]
            layouts.append(dp.evaluate(stages))
            used |= {cluster.index(d) for d in ids}
            todo = [s for s in todo if (s.device_ids, s.start, s.end) not in mine]
    pool = [i for i in free if i not in used]
    for chain in _chains(cluster, todo):
        stages = _fill(cluster, model, workload, chain, pool)
        if stages is not None:
            layouts.append(dp.evaluate(stages))
            taken = {d for s in stages for d in s.devices}
            used |= taken
            pool = [i for i in pool if i not in taken]
    return layouts, used - {cluster.index(d) for s in pinned for d in s.device_ids}


def _chains(cluster: Cluster, pinned: Sequence[StagePlan]) -> list[list[StageLayout]]:
    """Pinned stages joined where one starts at the other's end (one of the same region first)."""
    stages = sorted(
        (StageLayout(tuple(cluster.index(d) for d in s.device_ids), s.start, s.end) for s in pinned),
        key=lambda s: (s.start, -s.end, s.devices),
    )
    chains = []
    while stages:
        chain = [stages.pop(0)]
        while True:
            region = cluster.devices[chain[-1].devices[0]].region
            nxt = [s for s in stages if s.start == chain[-1].end]
            if not nxt:
                break
            best = min(nxt, key=lambda s: (cluster.devices[s.devices[0]].region != region, -s.end, s.devices))
            stages.remove(best)
            chain.append(best)
        chains.append(chain)
    return chains


def _fill(
    cluster: Cluster, model: ModelSpec, workload: Workload, chain: list[StageLayout], pool: list[int]
) -> list[StageLayout] | None:
    """The chain with its gaps [0, start) and [end, L) filled from `pool`, or None."""
    region = cluster.devices[chain[0].devices[0]].region
    machines = free_machines(cluster, model, workload, pool, region)
    before = fill_gap(model, workload, cluster, machines, 0, chain[0].start)
    if before is None:
        return None
    taken = {d for s in before for d in s.devices}
    machines = [m for m in machines if not taken & set(m[0])]
    after = fill_gap(model, workload, cluster, machines, chain[-1].end, model.num_layers)
    return None if after is None else before + chain + after


def free_machines(cluster: Cluster, model: ModelSpec, workload: Workload, pool: list[int], region: str):
    """Free machines as (TP group, layer cap, per-layer cost), the region's and the largest first."""
    members: dict[str, list[int]] = {}
    for i in sorted(pool):
        members.setdefault(f"{cluster.devices[i].region}/{cluster.devices[i].machine}", []).append(i)
    tokens = workload.s_in_max + workload.s_out
    out = []
    for devs in members.values():
        t = max(t for t in TP_DEGREES if t <= len(devs))
        group = tuple(devs[:t])
        cap = group_max_layers(cluster, group, model, tokens, workload.batch_size)
        unit = (
            comp_cost(cluster, group, model, 1, float(workload.s_in), workload.s_out).total
            + tp_comm_cost(cluster, group, model, 1, float(workload.s_in), workload.s_out).total
        )
        if cap > 0:
            other = cluster.devices[group[0]].region != region
            out.append((group, cap, float(unit), (other, -cap * t, group)))
    return [m[:3] for m in sorted(out, key=lambda m: m[3])]


def fill_gap(model, workload, cluster, machines, start: int, end: int) -> list[StageLayout] | None:
    """Layers [start, end) over the first machines whose caps hold them, split by speed."""
    if start == end:
        return []
    chosen, room = [], 0
    for machine in machines:
        if room >= end - start:
            break
        chosen.append(machine)
        room += machine[1]
    split = balanced_split([m[2] for m in chosen], [m[1] for m in chosen], end - start) if chosen else None
    if split is None:
        return None
    stages, position = [], start
    for (group, _, _), layers in zip(chosen, split, strict=True):
        if layers > 0:
            stages.append(StageLayout(group, position, position + layers))
            position += layers
    return stages


def search_around(
    cluster, model, workload, config, previous, layout_cache, pinned, search: Search
) -> SearchResult:
    """The search with pinned stages: completion, then `search` over the free devices, then the
    whole plan simulated."""
    free = free_devices(cluster, pinned, config.one_stage_per_machine)
    layouts, used = pinned_pipelines(cluster, model, workload, pinned, free, previous)
    rest = [cluster.devices[i].id for i in free if i not in used]
    found = None
    if rest:
        try:
            found = search(
                cluster.subset(frozenset(rest)), model, workload, config, previous, None, layout_cache
            )
        except NoFeasiblePlanError:
            found = None  # the free devices cannot hold a replica alone: only pinned pipelines
    if found is not None:
        layouts += plan_layouts(cluster, model, workload, found.plan)
    if not layouts:
        raise NoFeasiblePlanError(
            f"neither the pinned stages nor the free devices make a replica of {model.name}"
        )
    trace = make_trace(model, workload)
    result = evaluate_layouts(cluster, layouts, model, trace, workload)
    plan = make_plan(cluster, model, workload, layouts, result, trace.deadline_s, config.capacity)
    gens, evals = (found.generations, found.evaluations) if found else (0, 0)
    return SearchResult(
        plan, result, gens, evals, found.elapsed_s if found else 0.0, found.history if found else ()
    )


def idle_pipelines(
    cluster: Cluster, model: ModelSpec, workload: Workload, idle: Sequence[int], deadline_s: float
) -> list[PipelineLayout]:
    """Extra pipelines from machines a plan leaves idle, region by region: the largest machines
    first, layers split by speed (as the completion fills gaps), kept only if they can serve
    within the SLO. The genetic search rates a region group's pipelines against the group's share
    of the offered rate, so once that share is met it has no reason to use the rest."""
    dp = PipelineDP(cluster, model, workload)
    out = []
    for region in sorted({cluster.devices[i].region for i in idle}):
        pool = [i for i in idle if cluster.devices[i].region == region]
        while pool:
            machines = free_machines(cluster, model, workload, pool, region)
            stages = fill_gap(model, workload, cluster, machines, 0, model.num_layers)
            if stages is None:
                break
            layout = dp.evaluate(stages)
            taken = {cluster.devices[d].machine for s in stages for d in s.devices}
            pool = [i for i in pool if cluster.devices[i].machine not in taken]
            if pipeline_capacity(cluster, layout, model, workload, deadline_s).slo_rps > 0:
                out.append(layout)
    return out
