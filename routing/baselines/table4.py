"""The plan HexGen reported for its heterogeneous full-price cluster (Appendix F, Table 4), as a
fixed Plan on `routing/scenarios/hexgen_clusters.py`'s cluster of that name: the baseline the
scheduler benchmark replays."""

from __future__ import annotations

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec
from hexswarm.routing.scheduler.plan import PipelinePlan, Plan, StagePlan


def _ids(machine: str, gpus: range | list[int]) -> tuple[str, ...]:
    return tuple(f"{machine}-g{i}" for i in gpus)


# HexGen Appendix F, Table 4: each pipeline as its stages' device ids ([TP degrees] in comments).
TABLE4_STAGES: tuple[tuple[tuple[str, ...], ...], ...] = (
    (_ids("iceland-0", range(0, 4)), _ids("iceland-0", range(4, 8))),  # [4, 4]
    (_ids("iceland-1", range(0, 4)), _ids("iceland-1", range(4, 8))),  # [4, 4]
    (
        _ids("norway-0", [0, 1]),
        _ids("norway-0", [2]),
        _ids("norway-1", [0]),
        _ids("norway-1", [1, 2]),
    ),  # [2,1,1,2]
    (_ids("nevada-0", range(0, 4)), _ids("nevada-0", range(4, 8))),  # [4, 4]
    (_ids("illinois-a6000-0", [0, 1]), _ids("illinois-a6000-0", [2])),  # [2, 1]
    (_ids("illinois-a6000-0", [3, 4]), _ids("illinois-a6000-0", [5])),  # [2, 1]
    (_ids("illinois-a6000-1", [0, 1]), _ids("illinois-a6000-1", [2])),  # [2, 1]
    (_ids("illinois-a6000-1", [3, 4]), _ids("illinois-a6000-1", [5])),  # [2, 1]
    (_ids("illinois-a6000-0", [6, 7]), _ids("illinois-a5000", [0, 1])),  # [2, 2]
    (_ids("illinois-a6000-1", [6, 7]), _ids("illinois-a5000", [2, 3])),  # [2, 2]
    (_ids("illinois-a40", [0, 1]), _ids("illinois-a5000", [4, 5])),  # [2, 2]
    (_ids("illinois-a40", [2, 3]), _ids("illinois-a5000", [6, 7])),  # [2, 2]
)


def table4_plan(cluster: Cluster, model: ModelSpec) -> Plan:
    """Table 4 as a fixed Plan; layers split proportional to stage memory, as §4.3 prescribes."""
    pipelines = []
    for stages in TABLE4_STAGES:
        memory = [sum(cluster.devices[cluster.index(d)].memory_bytes for d in ids) for ids in stages]
        total, acc, bounds = sum(memory), 0.0, [0]
        for m in memory:
            acc += m
            bounds.append(round(model.num_layers * acc / total))
        pipelines.append(
            PipelinePlan(
                tuple(StagePlan(ids, a, b) for ids, a, b in zip(stages, bounds, bounds[1:], strict=False))
            )
        )
    return Plan(model.name, model.num_layers, tuple(pipelines))
