"""Warm-started re-planning of a swarm after peers join or leave, with the cost of moving peers.

The engine is HexGen's genetic search (§4.3: K-means initial groups, merge / split / swap,
Algorithm 1 per group; `search.search`), run warm-started from the current plan (`previous=`)
with the swarm's constraints (`SearchConfig.one_stage_per_machine`: a peer is one process, one TP
group on one machine; pinned peers are planned around, `pinned_stages.py`). HexGen plans once,
offline; a swarm changes while it serves, so a re-plan must weigh what a better plan gains
against what moving peers costs: a moved peer reads its new layers (layer bytes / load
bandwidth, `moves.py`), serving its old range meanwhile where both fit (make-before-break, as a
live peer moves; `MoveCosts.make_before_break=False` values it as serving nothing), and a new
pipeline serves only once all its peers have loaded.

Up to four candidates are built and valued by their attainment over a horizon H after
publication, A_H (`moves.horizon_attainment`: the analytic attainment of the pipelines ready at
each moment, averaged over [0, H]):

* **keep** — the current plan's pipelines that are still whole; no move, no load.
* **patch** — whole pipelines stay; each broken pipeline's survivors keep their ranges and free
  machines of their region fill the holes the leavers left (`patch.py`); no move.
* **repair** — whole pipelines stay; in each region group (`hierarchical.region_groups`) that
  changed (a pipeline broke, a peer joined), the survivors of broken pipelines and the new or
  idle peers are searched again, warm-started from the broken pipelines' survivors.
* **full** — every pipeline of a changed region group is open to the search, warm-started from
  the current plan there (more freedom, more moves).

Coverage comes first: candidates with at least one whole pipeline (every block served) are
preferred to those without, whatever A_H says, and a plan that covers the model replaces one
that does not. Among the candidates within `tie` of the best A_H the one with the fewest moves
wins (so an equally good plan never moves more peers), and it is published only if its A_H
beats keep's by `margin` (this stops plans from flapping), or by `tie` when it moves no peer
that has a range (it only places new or idle peers). Region groups where nothing changed are not searched,
which keeps a re-plan of a 200-GPU swarm within seconds. In a swarm, machines that a candidate
leaves idle form extra pipelines where they can (`pinned_stages.idle_pipelines`): the search of
a region group stops caring once the group's share of the rate is met, a swarm keeps the rest
serving. (Searching each group at 2 x its share was tried: attainment within the run-to-run
noise, more moves.)
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from hexswarm.routing.scheduler.bounds.capacity import saturating_workload
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.plan import Plan, StagePlan
from hexswarm.routing.scheduler.plan_eval import make_plan, plan_layouts
from hexswarm.routing.scheduler.replan.moves import (
    Assignment,
    Move,
    MoveCosts,
    diff,
    layout_assignments,
    machine_of,
)
from hexswarm.routing.scheduler.replan.replan_candidates import (
    Valuer,
    device_ids_of,
    idle_filled,
    is_dirty,
    patched_pipelines,
    search_pool,
    taken,
)
from hexswarm.routing.scheduler.search.genetic import SearchConfig
from hexswarm.routing.scheduler.search.hierarchical import region_groups
from hexswarm.routing.scheduler.search.pinned_stages import free_devices, pinned_pipelines
from hexswarm.routing.scheduler.search.search import search
from hexswarm.routing.scheduler.simulation.serving import evaluate_layouts
from hexswarm.routing.scheduler.simulation.simulator import make_trace

REPLAN_CONFIG = SearchConfig(
    time_budget_s=2.0,
    stall_generations=8,
    finalists=1,
    polish_stall=0,  # no simulated polish (`sim_polish.py`): a re-plan stays short
    capacity=False,
    one_stage_per_machine=True,
)
DEFAULT_COSTS = MoveCosts()


@dataclass(frozen=True)
class ReplanResult:
    """The plan to follow, the moves that lead to it, and how it was chosen."""

    plan: Plan
    moves: tuple[Move, ...]  # peers that change range (empty when not published)
    publish: bool  # False: keep following the current plan
    value: float  # A_H of `plan`
    current_value: float  # A_H (= attainment) of the current plan's whole pipelines
    candidates: tuple[tuple[str, float, int], ...]  # (name, A_H, moves) of every candidate
    max_load_s: float  # longest load among the peers that (re)load
    elapsed_s: float  # wall clock
    cpu_s: float = 0.0  # CPU time of this process (what a busy shared machine does not inflate)


def replan(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    previous: Plan | None,
    config: SearchConfig = REPLAN_CONFIG,
    costs: MoveCosts = DEFAULT_COSTS,
    pinned: Sequence[StagePlan] = (),
    current: Mapping[str, Assignment] | None = None,
    known: frozenset[str] | None = None,
    layout_cache: dict | None = None,
    reopen: Sequence[str] = (),
) -> ReplanResult:
    """Re-plans `cluster` from `previous` (module docstring); raises NoFeasiblePlanError.

    `current`: the range each peer serves now (default: the previous plan's); `known`: device
    ids the previous plan was made with (peers with none of them count as joined; default: the
    plan's own devices, so a peer the plan left idle counts as joined). `reopen`: regions whose
    groups are searched even if nothing changed there (a periodic re-plan re-opens one region
    group at a time, so that a plan repaired many times is searched afresh within a bounded time).
    """
    start, cpu = time.perf_counter(), time.process_time()
    if workload.objective == "throughput":  # as `search.search`: A_H then grows with capacity
        workload = saturating_workload(cluster, model, workload)
    if previous is None:
        return _cold(cluster, model, workload, config, costs, pinned, layout_cache, start, current or {})
    current = dict(current) if current is not None else plan_assignments(cluster, previous)
    deadline = make_trace(model, workload).deadline_s
    intact = [p for p in previous.pipelines if all(d in cluster._positions for d in p.device_ids)]
    kept = plan_layouts(cluster, model, workload, replace(previous, pipelines=tuple(intact)))
    whole = config.one_stage_per_machine
    free = free_devices(cluster, pinned, whole)
    kept_devices = taken(cluster, {d for lay in kept for d in lay.devices}, whole)
    pinned_layouts, filled = pinned_pipelines(
        cluster, model, workload, pinned, [i for i in free if i not in kept_devices], previous
    )
    fixed = kept + pinned_layouts
    filled = taken(cluster, filled, whole)
    open_devices = [i for i in free if i not in kept_devices and i not in filled]
    planned = {machine_of(cluster, d) for d in previous.device_ids if d in cluster._positions}
    planned |= {machine_of(cluster, d) for d in known or () if d in cluster._positions}
    open_set = set(open_devices)
    valuer = Valuer(cluster, model, workload, current, costs, deadline, kept)
    candidates = [valuer.candidate("keep", kept)]
    patched = patched_pipelines(cluster, model, workload, previous, open_devices, whole, deadline)
    if patched:
        layouts = (
            fixed
            + patched
            + (idle_filled(cluster, model, workload, fixed + patched, free, deadline) if whole else [])
        )
        candidates.append(valuer.candidate("patch", layouts))
    order = sorted(free)  # `subset` keeps the cluster's order: position p of it is order[p]
    regions = region_groups(cluster.subset(device_ids_of(cluster, free)), model)
    groups = [[order[p] for p in g] for g in regions]
    dirty = [
        g
        for g in groups
        if is_dirty(cluster, g, open_devices, planned, previous)
        or any(cluster.devices[i].region in reopen for i in g)
    ]
    budget = replace(
        config, time_budget_s=config.time_budget_s / max(1, 2 * len(dirty)), finalists=1, capacity=False
    )
    for name in ("repair", "full"):
        layouts = list(fixed if name == "repair" else pinned_layouts)
        if name == "full":
            layouts += [lay for lay in kept if not any(set(lay.devices) & set(g) for g in dirty)]
        for group in dirty:
            pool = [i for i in group if i in open_set or (name == "full" and i in kept_devices)]
            layouts += search_pool(cluster, model, workload, budget, previous, pool, free, layout_cache)
        if whole:
            layouts += idle_filled(cluster, model, workload, layouts, free, deadline)
        candidates.append(valuer.candidate(name, layouts))
    if not costs.move_placed:
        # keep stays a candidate: the current plan is followed as it is, whatever it moved
        candidates = [c for c in candidates if c.name == "keep" or all(m.old is None for m in c.moves)]
    # Coverage first: a candidate with a whole pipeline serves every block; one without serves
    # nothing, whatever its (then zero) attainment says. Among the ones that cover, A_H decides.
    covering = [c for c in candidates if c.layouts] or candidates
    best = max(c.value for c in covering)
    chosen = min((c for c in covering if c.value >= best - costs.tie), key=lambda c: (len(c.moves), -c.value))
    keep = candidates[0]
    # the margin guards placed peers against flapping; a plan that moves none of them (it only
    # gives new or idle peers a range) needs only to be better than the tie
    needed = costs.margin if any(m.old is not None for m in chosen.moves) else costs.tie
    newly_covers = bool(chosen.layouts) and not keep.layouts
    publish = chosen is not keep and (newly_covers or chosen.value > keep.value + needed)
    final = chosen if publish else keep
    layouts = list(final.layouts) if final.layouts else []
    trace = make_trace(model, workload)
    result = evaluate_layouts(cluster, layouts, model, trace, workload)
    plan = make_plan(cluster, model, workload, layouts, result, trace.deadline_s, capacity=False)
    _, load = diff(model, current, layout_assignments(cluster, layouts), costs.load_bandwidth)
    return ReplanResult(
        plan,
        final.moves if publish else (),
        publish,
        final.value,
        keep.value,
        tuple((c.name, round(c.value, 4), len(c.moves)) for c in candidates),
        max(load.values(), default=0.0),
        time.perf_counter() - start,
        time.process_time() - cpu,
    )


def plan_assignments(cluster: Cluster, plan: Plan) -> dict[str, Assignment]:
    """Peer (machine) -> range under `plan`, for the peers still in `cluster`."""
    out = {}
    for pipeline in plan.pipelines:
        for stage in pipeline.stages:
            if stage.device_ids[0] in cluster._positions:
                machine = cluster.devices[cluster.index(stage.device_ids[0])].machine
                out[machine] = stage  # a stage is an Assignment (moves.py)
    return out


def _cold(cluster, model, workload, config, costs, pinned, cache, start, current) -> ReplanResult:
    """No previous plan: the search, then (in a swarm) pipelines of the machines it left idle."""
    plan = search(cluster, model, workload, config, pinned=pinned, layout_cache=cache).plan
    if config.one_stage_per_machine:
        layouts = plan_layouts(cluster, model, workload, plan)
        trace = make_trace(model, workload)
        free = free_devices(cluster, pinned, True)
        layouts += idle_filled(cluster, model, workload, layouts, free, trace.deadline_s)
        result = evaluate_layouts(cluster, layouts, model, trace, workload)
        plan = make_plan(cluster, model, workload, layouts, result, trace.deadline_s, capacity=False)
    return _result(cluster, model, workload, plan, costs, start, current)


def _result(cluster, model, workload, plan, costs, start, current) -> ReplanResult:
    layouts = plan_layouts(cluster, model, workload, plan)
    moves, load = diff(model, current, layout_assignments(cluster, layouts), costs.load_bandwidth)
    value = plan.estimate.attainment if plan.estimate else 0.0
    elapsed = time.perf_counter() - start
    return ReplanResult(
        plan,
        tuple(moves),
        True,
        value,
        0.0,
        (("cold", value, len(moves)),),
        max(load.values(), default=0.0),
        elapsed,
    )
