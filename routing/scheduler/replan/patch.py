"""Patching broken pipelines: the survivors keep their ranges, free machines fill the holes.

When a peer leaves, its pipeline breaks; its other peers (the survivors) still hold their layers.
The cheapest repair moves none of them: each hole the leavers left, [start, end), is filled by
one free machine of the survivors' region that can hold it (the smallest of those that give the
patched pipeline within 5 % of the most SLO capacity, `fitness.pipeline_capacity`), or,
when no single machine holds it, by several split by speed (`pinned_stages.fill_gap`). Only the
fillers load layers (the hole's), and they were idle or new, so a patch costs no move at all;
the survivors serve again as soon as the fillers have loaded.

This is one of the re-planner's candidates (`replan.py`): it is chosen when its value over the
horizon is as good as a search's (a search may regroup the survivors better, but moves them).
Broken pipelines are patched strongest first (most surviving GPUs), each from what is left.
"""

from __future__ import annotations

from collections.abc import Sequence

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP, PipelineLayout, StageLayout
from hexswarm.routing.scheduler.plan import Plan
from hexswarm.routing.scheduler.search.pinned_stages import fill_gap, free_machines
from hexswarm.routing.scheduler.simulation.fitness import pipeline_capacity


def survivors(cluster: Cluster, previous: Plan) -> list[list[StageLayout]]:
    """Per broken pipeline of `previous` (a peer of it has left), the stages still present."""
    out = []
    for pipeline in previous.pipelines:
        present = [s for s in pipeline.stages if all(d in cluster._positions for d in s.device_ids)]
        if present and len(present) < len(pipeline.stages):
            out.append(
                [StageLayout(tuple(cluster.index(d) for d in s.device_ids), s.start, s.end) for s in present]
            )
    return out


def patch_pipelines(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    broken: Sequence[list[StageLayout]],
    pool: Sequence[int],
    deadline_s: float,
    whole_machines: bool = True,
) -> list[PipelineLayout]:
    """The broken pipelines whose holes free machines of `pool` (device indices) can fill and
    that then serve within the SLO (module docstring). `whole_machines`: a filler's machine
    fills no other hole (a swarm's peer serves one stage)."""
    dp = PipelineDP(cluster, model, workload)
    pool = list(pool)
    out = []
    for stages in sorted(broken, key=lambda st: (-sum(len(s.devices) for s in st), st[0].devices)):
        region = cluster.devices[stages[0].devices[0]].region
        patched, removed = list(stages), set()
        for start, end in _holes(stages, model.num_layers):
            filler = _fill(cluster, model, workload, dp, patched, pool, region, start, end, deadline_s)
            if filler is None:
                break
            patched = sorted(patched + filler, key=lambda s: s.start)
            taken = {d for s in filler for d in s.devices}
            if whole_machines:  # a peer is one machine serving one stage: its idle devices too
                machines = {cluster.devices[d].machine for d in taken}
                taken = {i for i in pool if cluster.devices[i].machine in machines}
            removed |= taken
            pool = [i for i in pool if i not in taken]
        else:
            layout = dp.evaluate(patched)
            if pipeline_capacity(cluster, layout, model, workload, deadline_s).slo_rps > 0:
                out.append(layout)
                continue
        pool = sorted(set(pool) | removed)  # this pipeline stays broken: its fillers go back
    return out


def _holes(stages: Sequence[StageLayout], num_layers: int) -> list[tuple[int, int]]:
    """The layer ranges no stage covers."""
    holes, position = [], 0
    for stage in sorted(stages, key=lambda s: s.start):
        if stage.start > position:
            holes.append((position, stage.start))
        position = max(position, stage.end)
    return holes + ([(position, num_layers)] if position < num_layers else [])


def _fill(cluster, model, workload, dp, stages, pool, region, start, end, deadline_s):
    """Stages that fill [start, end): the best single free machine of `region`, else several."""
    machines = [
        m for m in free_machines(cluster, model, workload, pool, region) if _region(cluster, m) == region
    ]
    options = []  # (SLO capacity of the patched pipeline, GPUs, filler)
    for group, cap, _ in machines:
        if cap >= end - start:
            filler = [StageLayout(group, start, end)]
            layout = dp.evaluate(sorted(stages + filler, key=lambda s: s.start))
            options.append(
                (pipeline_capacity(cluster, layout, model, workload, deadline_s).slo_rps, len(group), filler)
            )
    if options:  # the smallest machine within 5 % of the best: a big one may serve better elsewhere
        top = max(o[0] for o in options)
        return min((o for o in options if o[0] >= 0.95 * top), key=lambda o: (o[1], -o[0]))[2]
    return fill_gap(model, workload, cluster, machines, start, end)


def _region(cluster: Cluster, machine: tuple) -> str:
    return cluster.devices[machine[0][0]].region
