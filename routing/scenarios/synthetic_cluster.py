"""A seeded synthetic swarm for scale tests: consumer and datacenter GPUs in many regions.

HexGen evaluates on at most 58 GPUs (§5.1); a public swarm needs the scheduler to scale to 1,000
GPUs in 50 regions. This module draws such a cluster from a seed, with every figure taken from the
same sources as `hexgen_clusters.py`:

* GPUs: datasheet figures from `gpu_catalog`. A machine holds 1 to 8 GPUs of one type (as in
  §5.1's rented instances); about half the GPUs are consumer cards (RTX 3090 / 3090 Ti / 4090,
  RTX A4000 / A5000 workstation cards) and half datacenter parts (A100, H100, A6000, A40, L40,
  L40S, A10, L4, V100, T4).
* Network: HexGen footnote 3 (§5.1): 2 ms and 5 Gbps inside a region; 40-150 ms and 0.3-1.0 Gbps
  across regions. Regions are points on a unit square, so the draw is geographic: a region
  pair's latency grows and its bandwidth falls linearly with their distance, spanning the whole
  range from the closest to the farthest pair. Inside a machine: PCIe 4.0 (`hexgen_clusters.PCIE`).

The N x N matrices are filled with numpy from region and machine indices (expanding 1,225
region-pair overrides pair by pair, as `cluster.build_cluster` does, would take minutes at
1,000 GPUs); `cluster.network` still describes the same links, so `Cluster.with_devices` works.
"""

from __future__ import annotations

import numpy as np

from hexswarm.routing.scenarios.hexgen_clusters import PCIE, SAME_REGION
from hexswarm.routing.scheduler.cluster import Cluster, Device, Link, Network
from hexswarm.routing.scheduler.gpu_catalog import lookup

# (GPU type, relative weight) inside each family; weights follow how common the card is to rent.
CONSUMER = (("RTX3090", 3), ("RTX3090TI", 2), ("RTX4090", 3), ("A5000", 2), ("A4000", 1))
DATACENTER = (
    ("A100-40G", 2),
    ("A100-80G", 2),
    ("H100", 1),
    ("A6000", 2),
    ("A40", 2),
    ("L40", 1),
    ("L40S", 1),
    ("A10", 2),
    ("L4", 1),
    ("V100", 1),
    ("T4", 1),
)
CONSUMER_SHARE = 0.5  # probability that a machine holds consumer cards
MAX_MACHINE_GPUS = 8

# HexGen footnote 3: cross-region latency 40-150 ms and bandwidth 0.3-1.0 Gbps.
CROSS_LATENCY_MS = (40.0, 150.0)
CROSS_BANDWIDTH_GBPS = (0.3, 1.0)


def synthetic_cluster(num_gpus: int = 1000, num_regions: int = 50, seed: int = 0) -> Cluster:
    """A cluster of `num_gpus` GPUs in `num_regions` regions, the same for the same arguments."""
    if num_regions < 1 or num_gpus < num_regions:
        raise ValueError("need at least one region and at least one GPU per region")
    rng = np.random.default_rng(seed)
    region_sizes = _region_sizes(rng, num_gpus, num_regions)
    devices: list[Device] = []
    for r, size in enumerate(region_sizes):
        devices += _region_devices(rng, f"r{r:0{len(str(num_regions - 1))}d}", size)
    cross = _cross_region_links(rng, num_regions)
    return _assemble(devices, cross)


def _region_sizes(rng: np.random.Generator, num_gpus: int, num_regions: int) -> np.ndarray:
    """GPUs per region: one each, the rest spread with uneven weights (some regions are hubs)."""
    weights = rng.uniform(0.2, 1.8, size=num_regions)
    return 1 + rng.multinomial(num_gpus - num_regions, weights / weights.sum())


def _region_devices(rng: np.random.Generator, region: str, count: int) -> list[Device]:
    """Machines of 1..8 GPUs of one type each, until the region holds `count` GPUs."""
    devices: list[Device] = []
    machine = 0
    while len(devices) < count:
        size = min(int(rng.integers(1, MAX_MACHINE_GPUS + 1)), count - len(devices))
        family = CONSUMER if rng.random() < CONSUMER_SHARE else DATACENTER
        weights = np.array([w for _, w in family], dtype=float)
        gpu = family[int(rng.choice(len(family), p=weights / weights.sum()))][0]
        spec = lookup(gpu)
        name = f"{region}-m{machine}"
        devices += [Device.from_spec(f"{name}-g{i}", spec, name, region) for i in range(size)]
        machine += 1
    return devices


def _cross_region_links(rng: np.random.Generator, num_regions: int) -> tuple[np.ndarray, np.ndarray]:
    """(R, R) latency (s) and bandwidth (bytes/s) between regions placed on a unit square."""
    points = rng.random((num_regions, 2))
    dist = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=-1)
    span = dist.max() or 1.0  # one region: no pairs
    near = dist / span  # 0 for the closest possible pair, 1 for the farthest drawn pair
    lo_ms, hi_ms = CROSS_LATENCY_MS
    lo_gbps, hi_gbps = CROSS_BANDWIDTH_GBPS
    latency = (lo_ms + (hi_ms - lo_ms) * near) / 1000.0
    bandwidth = (hi_gbps - (hi_gbps - lo_gbps) * near) * 1e9 / 8
    return latency, bandwidth


def _assemble(devices: list[Device], cross: tuple[np.ndarray, np.ndarray]) -> Cluster:
    """Fills the N x N matrices: machine -> PCIe, region -> footnote 3, else the region pair."""
    regions = list(dict.fromkeys(d.region for d in devices))  # creation order = draw order
    index = {r: i for i, r in enumerate(regions)}
    region_of = np.array([index[d.region] for d in devices])
    machines = {m: i for i, m in enumerate(dict.fromkeys(d.machine for d in devices))}
    machine_of = np.array([machines[d.machine] for d in devices])
    cross_latency, cross_bandwidth = cross
    latency = cross_latency[np.ix_(region_of, region_of)]
    bandwidth = cross_bandwidth[np.ix_(region_of, region_of)]
    same_region = region_of[:, None] == region_of[None, :]
    same_machine = machine_of[:, None] == machine_of[None, :]
    latency[same_region], bandwidth[same_region] = SAME_REGION.latency_s, SAME_REGION.bandwidth
    latency[same_machine], bandwidth[same_machine] = PCIE.latency_s, PCIE.bandwidth
    np.fill_diagonal(latency, 0.0)
    np.fill_diagonal(bandwidth, np.inf)
    pairs = tuple(
        (regions[a], regions[b], Link(float(cross_latency[a, b]), float(cross_bandwidth[a, b])))
        for a in range(len(regions))
        for b in range(a + 1, len(regions))
    )
    return Cluster(
        tuple(devices), latency, bandwidth, Network(PCIE, SAME_REGION, Link(0.1, 0.5e9 / 8), pairs)
    )
