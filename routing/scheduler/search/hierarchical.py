"""Search large clusters region by region, so the cost grows linearly with the number of GPUs.

The genetic search of §4.3 is quadratic or worse in the number of devices (K-means over the
N x N communication matrix, DP state spaces that grow with group size, individuals of N
devices), so at 1,000 GPUs a flat search runs out of time before it has placed them all.
Cross-region links (HexGen footnote 3: 40-150 ms, 0.3-1 Gbps) make pipelines that span regions
slow, and HexGen's own initial K-means groups follow regions, so we search hierarchically:

1. Regions become *region groups*: a region whose GPUs cannot hold a replica (plus room for KV
   cache) is merged with the nearest region (lowest latency) that is also too small, or else
   the nearest region, until every group can hold one.
2. Each region group gets its own search (`search.search`, handed in: it runs the genetic search
   of `genetic.py` on a group of one region or a small one) over its devices, with the
   offered rate shared in proportion to the group's memory bandwidth (decode is bound by weight
   scans) and a time budget in proportion to its devices.
3. The groups' pipelines form one plan, which the event simulation scores on the whole trace.

Re-planning after devices leave is a repair, not a search: pipelines that lost no device stay
as they were, and the survivors of each broken pipeline are laid out again with Algorithm 1
(pooled per region group when they are too few to hold a replica). Devices that joined since
the previous plan stay idle until the next fresh search. (A fresh search of every
changed group would cost about as much as the first search, since 5% of 1,000 GPUs leaving
touches most of the 50 regions.)
"""

from __future__ import annotations

import time
from dataclasses import replace

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import weight_memory
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout
from hexswarm.routing.scheduler.plan import Plan
from hexswarm.routing.scheduler.plan_eval import make_plan, plan_layouts
from hexswarm.routing.scheduler.search.ga_fitness import Evaluator, estimated_score
from hexswarm.routing.scheduler.search.ga_operators import Mutator
from hexswarm.routing.scheduler.search.search_result import NoFeasiblePlanError, Search, SearchResult
from hexswarm.routing.scheduler.simulation.fitness import estimate_layouts
from hexswarm.routing.scheduler.simulation.serving import evaluate_layouts
from hexswarm.routing.scheduler.simulation.simulator import make_trace

FLAT_LIMIT = 128  # devices; larger clusters with several regions are searched region by region
ROOM_FOR_KV = 1.25  # a region group holds at least this many replicas' worth of weights
FINAL_SHARE = 0.15  # share of the budget kept for scoring the assembled plan


def region_groups(cluster: Cluster, model: ModelSpec) -> list[list[int]]:
    """Device indices per region group (module docstring, step 1). Memory and replica in the
    compute dtype's bytes (a quantized device's memory counts for more: `cost_model.weight_memory`)."""
    members: dict[str, list[int]] = {}
    for i, d in enumerate(cluster.devices):
        members.setdefault(d.region, []).append(i)
    groups = list(members.values())
    need = ROOM_FOR_KV * model.weight_bytes
    held = [weight_memory(d, model) for d in cluster.devices]

    def memory(g: list[int]) -> float:
        return sum(held[i] for i in g)

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
    previous: Plan | None,
    layout_cache: dict | None,
    search: Search,
) -> SearchResult:
    """The search of large clusters (module docstring); `search` searches each region group."""
    start, cpu_start = time.perf_counter(), time.process_time()
    groups = region_groups(cluster, model)
    layouts: list[PipelineLayout] = []
    generations = evaluations = 0
    if previous is not None:
        whole = getattr(config, "one_stage_per_machine", False)
        layouts = _repair(cluster, model, workload, groups, previous, layout_cache, whole)
    else:
        for found in _search_groups(cluster, model, workload, config, groups, layout_cache, search):
            layouts += plan_layouts(cluster, model, workload, found.plan)
            generations += found.generations
            evaluations += found.evaluations
    if not layouts:
        raise NoFeasiblePlanError(f"no region group of the cluster can hold a replica of {model.name}")
    trace = make_trace(model, workload)
    result = evaluate_layouts(cluster, layouts, model, trace, workload)
    plan = make_plan(cluster, model, workload, layouts, result, trace.deadline_s, config.capacity)
    fitness = _estimated_fitness(cluster, layouts, model, workload, trace.deadline_s)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return SearchResult(plan, result, generations, evaluations, elapsed, (), ((fitness, result),), cpu)


def _search_groups(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    config,
    groups: list[list[int]],
    cache: dict | None,
    search: Search,
):
    """Yields a SearchResult for each region group that can hold a replica."""
    bandwidth = [sum(cluster.devices[i].bandwidth for i in g) for g in groups]
    budget = config.time_budget_s * (1 - FINAL_SHARE)
    for n, group in enumerate(groups):
        share = bandwidth[n] / sum(bandwidth)
        sub_workload = replace(
            workload,
            rate=workload.rate * share,
            num_requests=max(50, round(workload.num_requests * share)),
            seed=workload.seed + n,
        )
        # one finalist and no simulated polish per region: the budget goes to the regions' searches
        sub_config = replace(
            config,
            time_budget_s=budget * len(group) / len(cluster),
            finalists=1,
            polish_stall=0,
            capacity=False,
        )
        sub = cluster.subset(frozenset(cluster.devices[i].id for i in group))
        try:
            yield search(sub, model, sub_workload, sub_config, layout_cache=cache)
        except NoFeasiblePlanError:
            continue  # these devices cannot hold a replica even together: they stay idle


def _repair(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    groups: list[list[int]],
    previous: Plan,
    cache: dict | None,
    whole_machines: bool = False,
) -> list[PipelineLayout]:
    """Warm re-plan: intact pipelines stay; each broken pipeline's surviving devices are laid out
    again with Algorithm 1; survivors too few to hold a replica are pooled per region group
    and laid out together (as one group, or halves of it)."""
    evaluator = Evaluator(cluster, model, workload, layout_cache=cache, whole_machines=whole_machines)
    index = {d.id: i for i, d in enumerate(cluster.devices)}
    intact = [p for p in previous.pipelines if all(d in index for d in p.device_ids)]
    layouts = plan_layouts(cluster, model, workload, Plan(model.name, model.num_layers, tuple(intact)))
    mutator = Mutator(cluster, model, evaluator.accept_group, whole_machines)
    group_of = {i: n for n, g in enumerate(groups) for i in g}
    leftovers: dict[int, list[int]] = {}
    for pipeline in previous.pipelines:
        survivors = tuple(index[d] for d in pipeline.device_ids if d in index)
        if len(survivors) == len(pipeline.device_ids) or not survivors:
            continue
        repaired = _lay_out(survivors, evaluator, mutator, depth=0)
        if repaired:
            layouts += repaired
        else:
            leftovers.setdefault(group_of[survivors[0]], []).extend(survivors)
    for pool in leftovers.values():
        layouts += _lay_out(tuple(pool), evaluator, mutator, depth=2)
    return layouts


def _lay_out(
    pool: tuple[int, ...], evaluator: Evaluator, mutator: Mutator, depth: int
) -> list[PipelineLayout]:
    if not pool or not mutator.holds_replica(pool):
        return []
    layout = evaluator.dp.layout(pool) if evaluator.accept_group(pool) else None
    if layout is not None or depth == 0 or len(pool) < 2:
        return [layout] if layout is not None else []
    first, second = mutator.halves(pool)
    return _lay_out(tuple(first), evaluator, mutator, depth - 1) + _lay_out(
        tuple(second), evaluator, mutator, depth - 1
    )


def _estimated_fitness(cluster, layouts, model, workload, deadline_s) -> tuple[float, float]:
    """The assembled plan's fitness as `ga_fitness.Evaluator` scores one: attainment, or the
    requests/s carried when there is no deadline."""
    if workload.serving == "sequential":
        return (float("nan"), float("nan"))
    est = estimate_layouts(cluster, layouts, model, workload, deadline_s)
    return (estimated_score(est, workload), -est.mean_latency_s)
