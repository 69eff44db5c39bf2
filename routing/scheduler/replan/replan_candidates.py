"""The candidates a re-plan weighs (`replan.py`), and how each is valued.

A candidate is a set of pipeline layouts: the current plan's whole pipelines, broken ones
patched around their survivors (`patched_pipelines`), region groups searched again
(`search_pool`), and machines left idle formed into pipelines of their own (`idle_filled`).
`Valuer` values each by its attainment over the horizon after publication, A_H
(`moves.horizon_attainment`), charging the moves it needs: a moved peer loads its new layers,
serving its old range meanwhile where both fit (make-before-break), and a new pipeline serves
once all its peers have loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout
from hexswarm.routing.scheduler.plan import Plan
from hexswarm.routing.scheduler.plan_eval import plan_layouts
from hexswarm.routing.scheduler.replan.moves import (
    Move,
    MoveCosts,
    diff,
    horizon_attainment,
    layout_assignments,
    make_before_break_loads,
    old_pipeline_ends,
    ready_times,
)
from hexswarm.routing.scheduler.replan.patch import patch_pipelines, survivors
from hexswarm.routing.scheduler.search.pinned_stages import idle_pipelines
from hexswarm.routing.scheduler.search.search import search
from hexswarm.routing.scheduler.search.search_result import NoFeasiblePlanError
from hexswarm.routing.scheduler.simulation.fitness import pipeline_capacity


@dataclass(frozen=True)
class Candidate:
    """One way to go on: its layouts, the moves they need, and its value A_H."""

    name: str
    value: float  # A_H
    moves: tuple[Move, ...]
    layouts: tuple[PipelineLayout, ...]


def device_ids_of(cluster: Cluster, indices: Sequence[int]) -> frozenset[str]:
    return frozenset(cluster.devices[i].id for i in indices)


def taken(cluster: Cluster, devices: set[int], whole_machines: bool) -> set[int]:
    """`devices`, and with whole machines every device of their machines (one stage per machine)."""
    if not whole_machines:
        return devices
    machines = {cluster.devices[i].machine for i in devices}
    return {i for i, d in enumerate(cluster.devices) if d.machine in machines}


def is_dirty(cluster: Cluster, group: list[int], open_devices: list[int], planned, previous: Plan) -> bool:
    """A group changed when a peer (machine) in it joined or a pipeline with a peer in it broke."""
    members = set(group)
    if any(i in members and cluster.devices[i].machine not in planned for i in open_devices):
        return True
    ids = {cluster.devices[i].id for i in group}
    return any(
        ids & set(p.device_ids) and not all(d in cluster._positions for d in p.device_ids)
        for p in previous.pipelines
    )


def search_pool(cluster, model, workload, config, previous, pool, free, cache) -> list[PipelineLayout]:
    """The genetic search over `pool`, warm-started, at the pool's share of the offered rate."""
    if not pool:
        return []
    bandwidth = sum(cluster.devices[i].bandwidth for i in free)
    share = sum(cluster.devices[i].bandwidth for i in pool) / bandwidth
    sub_workload = replace(
        workload, rate=workload.rate * share, num_requests=max(50, round(workload.num_requests * share))
    )
    sub = cluster.subset(device_ids_of(cluster, pool))
    try:
        found = search(sub, model, sub_workload, config, previous=previous, layout_cache=cache)
    except NoFeasiblePlanError:
        return []  # these peers cannot hold a replica together: they stay idle
    return plan_layouts(cluster, model, workload, found.plan)


def patched_pipelines(
    cluster, model, workload, previous, open_devices, whole: bool, deadline
) -> list[PipelineLayout]:
    """Broken pipelines patched around their survivors with open machines (`patch.py`)."""
    open_set = set(open_devices)
    broken = [[s for s in st if set(s.devices) <= open_set] for st in survivors(cluster, previous)]
    broken = [st for st in broken if st]
    held = taken(cluster, {d for st in broken for s in st for d in s.devices}, whole)
    pool = [i for i in open_devices if i not in held]
    return patch_pipelines(cluster, model, workload, broken, pool, deadline, whole) if broken else []


class Valuer:
    """Values candidates by A_H against the current plan's whole pipelines (`kept`)."""

    def __init__(self, cluster, model, workload, current, costs: MoveCosts, deadline, kept) -> None:
        self.cluster, self.model, self.workload, self.current = cluster, model, workload, current
        self.costs, self.deadline, self.kept = costs, deadline, kept
        self.kept_capacities = [self._capacity(lay) for lay in kept]

    def _capacity(self, layout):
        return pipeline_capacity(self.cluster, layout, self.model, self.workload, self.deadline)

    def candidate(self, name: str, layouts) -> Candidate:
        cluster, model, costs = self.cluster, self.model, self.costs
        new = layout_assignments(cluster, layouts)
        moves, load = diff(model, self.current, new, costs.load_bandwidth)
        old = []
        if costs.make_before_break:
            load, keeps_old = make_before_break_loads(
                cluster, model, self.workload, self.current, new, load, costs.load_bandwidth
            )
            ends = old_pipeline_ends(cluster, self.kept, layouts, load, keeps_old)
            old = list(zip(self.kept_capacities, ends, strict=True))
        capacities = [self._capacity(lay) for lay in layouts]
        ready = ready_times(cluster, layouts, load)
        value = horizon_attainment(capacities, ready, self.workload.rate, costs.horizon_s, old)
        return Candidate(name, value, tuple(moves), tuple(layouts))


def idle_filled(cluster, model, workload, layouts, free, deadline) -> list[PipelineLayout]:
    """Pipelines of the machines no layout uses (`pinned_stages.idle_pipelines`)."""
    busy = {cluster.devices[d].machine for lay in layouts for d in lay.devices}
    idle = [i for i in free if cluster.devices[i].machine not in busy]
    return idle_pipelines(cluster, model, workload, idle, deadline)
