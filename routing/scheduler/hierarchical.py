"""Search large clusters region by region, so the cost grows linearly with the number of GPUs.

The genetic search of §4.3 is quadratic or worse in the number of devices (K-means over the
N x N communication matrix, DP state spaces that grow with group size, individuals of N
devices), so at 1,000 GPUs a flat search runs out of time before it has placed them all.
Cross-region links (HexGen footnote 3: 40-150 ms, 0.3-1 Gbps) make pipelines that span regions
slow, and HexGen's own initial K-means groups follow regions, so we search hierarchically:

1. Regions become *region groups*: a region whose GPUs cannot hold a replica (plus room for KV
   cache) is merged with the nearest region (lowest latency) that is also too small, or else
   the nearest region, until every group can hold one.
2. Each region group gets its own genetic search (`genetic.search`) over its devices, with the
   offered rate shared in proportion to the group's memory bandwidth (decode is bound by weight
   scans) and a time budget in proportion to its devices.
3. The groups' pipelines form one plan, which the event simulation scores on the whole trace.

Re-planning after devices leave or join searches again, warm-started, only the region groups
whose devices changed; the others keep their pipelines as they were.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from routing.scheduler.cluster import Cluster
from routing.scheduler.fitness import estimate, pipeline_capacity
from routing.scheduler.model_spec import ModelSpec, Workload
from routing.scheduler.plan import Plan
from routing.scheduler.plan_eval import plan_layouts
from routing.scheduler.serving import evaluate_layouts
from routing.scheduler.simulator import make_trace

FLAT_LIMIT = 128  # devices; larger clusters with several regions are searched region by region
ROOM_FOR_KV = 1.25  # a region group holds at least this many replicas' worth of weights
FINAL_SHARE = 0.15  # share of the budget kept for scoring the assembled plan


def region_groups(cluster: Cluster, replica_bytes: float) -> list[list[int]]:
    """Device indices per region group (module docstring, step 1)."""
    members: dict[str, list[int]] = {}
    for i, d in enumerate(cluster.devices):
        members.setdefault(d.region, []).append(i)
    groups = list(members.values())
    need = ROOM_FOR_KV * replica_bytes

    def memory(g: list[int]) -> float:
        return sum(cluster.devices[i].memory_bytes for i in g)

    while len(groups) > 1:
        small = [g for g in groups if memory(g) < need]
        if not small:
            break
        g = min(small, key=memory)
        others = [h for h in groups if h is not g]
        pool = [h for h in others if memory(h) < need] or others
        nearest = min(pool, key=lambda h: cluster.latency[g[0], h[0]])
        groups = [h for h in others if h is not nearest] + [nearest + g]
    return sorted(groups, key=lambda g: g[0])


def search_by_region(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    config,
    previous: Plan | None = None,
    progress: Callable | None = None,
):
    """`genetic.search` for large clusters (module docstring); returns a `genetic.SearchResult`."""
    from routing.scheduler.genetic import NoFeasiblePlanError, SearchResult, make_plan, search

    start = time.perf_counter()
    groups = region_groups(cluster, model.weight_bytes)
    bandwidth = [sum(cluster.devices[i].bandwidth for i in g) for g in groups]
    budget = config.time_budget_s * (1 - FINAL_SHARE)
    kept = _unchanged_pipelines(cluster, groups, previous)
    pipelines, generations, evaluations = [], 0, 0
    for n, group in enumerate(groups):
        if n in kept:
            pipelines += kept[n]
            continue
        ids = frozenset(cluster.devices[i].id for i in group)
        sub = cluster.subset(ids)
        share = bandwidth[n] / sum(bandwidth)
        sub_workload = replace(
            workload,
            rate=workload.rate * share,
            num_requests=max(50, round(workload.num_requests * share)),
            seed=workload.seed + n,
        )
        changed = len(groups) - len(kept)
        sub_config = replace(config, time_budget_s=budget * len(group) / _devices_in(groups, kept), finalists=1)
        if previous is not None:
            sub_config = replace(sub_config, time_budget_s=budget / max(1, changed))
        sub_previous = _restrict(previous, ids) if previous is not None else None
        try:
            found = search(sub, model, sub_workload, sub_config, previous=sub_previous)
        except NoFeasiblePlanError:
            continue  # these devices cannot hold a replica even together: they stay idle
        pipelines += list(found.plan.pipelines)
        generations += found.generations
        evaluations += found.evaluations
        if progress is not None:
            progress(n, len(groups), found, time.perf_counter() - start)
    if not pipelines:
        raise NoFeasiblePlanError(f"no region group of the cluster can hold a replica of {model.name}")
    assembled = Plan(model.name, model.num_layers, tuple(pipelines))
    layouts = plan_layouts(cluster, model, workload, assembled)
    trace = make_trace(model, workload)
    result = evaluate_layouts(cluster, layouts, model, trace, workload)
    plan = make_plan(cluster, model, workload, layouts, result, trace.deadline_s)
    fitness = _estimated_fitness(cluster, layouts, model, workload, trace.deadline_s)
    elapsed = time.perf_counter() - start
    return SearchResult(plan, result, generations, evaluations, elapsed, (), ((fitness, result),))


def _devices_in(groups: list[list[int]], kept: dict[int, list]) -> int:
    return max(1, sum(len(g) for n, g in enumerate(groups) if n not in kept))


def _unchanged_pipelines(cluster: Cluster, groups: list[list[int]], previous: Plan | None) -> dict[int, list]:
    """Region groups whose previous pipelines are all intact and inside the group: those pipelines.

    Devices that joined such a group stay idle until the next fresh search (the plan does not
    record which devices it left idle, so a join cannot be told from an idle device)."""
    if previous is None:
        return {}
    kept = {}
    for n, group in enumerate(groups):
        ids = {cluster.devices[i].id for i in group}
        own = [p for p in previous.pipelines if set(p.device_ids) & ids]
        if own and all(set(p.device_ids) <= ids for p in own):
            kept[n] = own
    return kept


def _restrict(previous: Plan, ids: frozenset[str]) -> Plan:
    """The previous plan's pipelines that touch these devices (warm start of one group)."""
    own = tuple(p for p in previous.pipelines if set(p.device_ids) & ids)
    return Plan(previous.model, previous.num_layers, own)


def _estimated_fitness(cluster, layouts, model, workload, deadline_s) -> tuple[float, float]:
    if workload.serving == "sequential":
        return (float("nan"), float("nan"))
    est = estimate([pipeline_capacity(cluster, lay, model, workload, deadline_s) for lay in layouts], workload.rate)
    return (est.attainment, -est.mean_latency_s)
