"""The clusters of HexGen's evaluation (§5.1); the plan it reported for one of them (Table 4) is
`routing/baselines/table4.py`.

* heterogeneous-full-price (58 GPUs): Iceland 2 x 8 RTX 3090 Ti; Norway 2 x 3 RTX 3090 Ti;
  Nevada 1 x 8 A5000; Illinois 2 x 8 A6000, 1 x 8 A5000, 1 x 4 A40.
* heterogeneous-half-price (30 GPUs): Iceland, Norway and Nevada as above.
* homogeneous: 2 x 8 A100-40G (AWS p4d.24xlarge), NVLink inside a machine.

Network (footnote 3): 2 ms / 5 Gbps inside a region; 40-150 ms / 0.3-1.0 Gbps across regions.
The paper gives only the range, so each region pair below gets a value inside it, ordered by
geography (Iceland-Norway closest, Norway-Nevada farthest). Inside a machine: PCIe.
"""

from __future__ import annotations

from hexswarm.routing.scheduler.cluster import Cluster, Device, Link, Network, build_cluster
from hexswarm.routing.scheduler.gpu_catalog import lookup

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
