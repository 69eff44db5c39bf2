"""The clusters of HexGen's evaluation (§5.1) and the plan it reported for one of them (Table 4).

* heterogeneous-full-price (58 GPUs): Iceland 2 x 8 RTX 3090 Ti; Norway 2 x 3 RTX 3090 Ti;
  Nevada 1 x 8 A5000; Illinois 2 x 8 A6000, 1 x 8 A5000, 1 x 4 A40.
* heterogeneous-half-price (30 GPUs): Iceland, Norway and Nevada as above.
* homogeneous: 2 x 8 A100-40G (AWS p4d.24xlarge), NVLink inside a machine.

Network (footnote 3): 2 ms / 5 Gbps inside a region; 40-150 ms / 0.3-1.0 Gbps across regions.
The paper gives only the range, so each region pair below gets a value inside it, ordered by
geography (Iceland-Norway closest, Norway-Nevada farthest). Inside a machine: PCIe.
"""

from __future__ import annotations

from routing.scheduler.cluster import Cluster, Device, Link, Network, build_cluster
from routing.scheduler.gpu_catalog import lookup
from routing.scheduler.model_spec import ModelSpec
from routing.scheduler.plan import PipelinePlan, Plan, StagePlan

PCIE = Link(1e-5, 16e9)  # PCIe 4.0 x16, ~16 GB/s achieved by NCCL between consumer GPUs
NVLINK = Link(5e-6, 300e9)  # A100 NVLink 3 via NVSwitch, 300 GB/s each way
SAME_REGION = Link(2e-3, 5e9 / 8)  # footnote 3

# (region, region) -> (latency ms, bandwidth Gbps), inside footnote 3's 40-150 ms / 0.3-1.0 Gbps.
CROSS_REGION = {
    ("iceland", "norway"): (40, 1.0),
    ("nevada", "illinois"): (50, 0.8),
    ("iceland", "illinois"): (110, 0.5),
    ("norway", "illinois"): (120, 0.4),
    ("iceland", "nevada"): (140, 0.3),
    ("norway", "nevada"): (150, 0.3),
}

# region -> [(machine name, GPU type, count)]
FULL_PRICE = {
    "iceland": [("iceland-0", "RTX3090TI", 8), ("iceland-1", "RTX3090TI", 8)],
    "norway": [("norway-0", "RTX3090TI", 3), ("norway-1", "RTX3090TI", 3)],
    "nevada": [("nevada-0", "A5000", 8)],
    "illinois": [
        ("illinois-a6000-0", "A6000", 8),
        ("illinois-a6000-1", "A6000", 8),
        ("illinois-a5000", "A5000", 8),
        ("illinois-a40", "A40", 4),
    ],
}
HALF_PRICE = {region: FULL_PRICE[region] for region in ("iceland", "norway", "nevada")}
HOMOGENEOUS = {"aws": [("p4d-0", "A100-40G", 8), ("p4d-1", "A100-40G", 8)]}

SCENARIOS = ("heterogeneous-full-price", "heterogeneous-half-price", "homogeneous")


def _devices(layout: dict[str, list[tuple[str, str, int]]]) -> list[Device]:
    devices = []
    for region, machines in layout.items():
        for machine, gpu, count in machines:
            spec = lookup(gpu)
            devices += [Device.from_spec(f"{machine}-g{i}", spec, machine, region) for i in range(count)]
    return devices


def _paper_network() -> Network:
    pairs = tuple((a, b, Link(ms / 1000, gbps * 1e9 / 8)) for (a, b), (ms, gbps) in CROSS_REGION.items())
    return Network(PCIE, SAME_REGION, Link(0.1, 0.5e9 / 8), pairs)


def scenario(name: str) -> Cluster:
    """One of SCENARIOS as a Cluster."""
    if name == "heterogeneous-full-price":
        return build_cluster(_devices(FULL_PRICE), _paper_network())
    if name == "heterogeneous-half-price":
        return build_cluster(_devices(HALF_PRICE), _paper_network())
    if name == "homogeneous":
        efa = Link(3e-5, 400e9 / 8)  # p4d: 4 x 100 Gbps EFA between instances
        return build_cluster(_devices(HOMOGENEOUS), Network(NVLINK, efa, efa))
    raise KeyError(f"unknown scenario {name!r}; scenarios: {', '.join(SCENARIOS)}")


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
