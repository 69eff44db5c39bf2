"""The heterogeneous clusters and workloads of HexGen-2's evaluation (§5.1, Figure 4).

GPU mixes, as Figure 4's caption and §5.1 give them (rented on one cloud):

* setting 1: 2 x H100, 6 x A100, 4 x L40, 8 x A6000 (20 GPUs);
* setting 2: 3 x H100, 3 x A100, 6 x L40, 6 x A6000 (18);
* setting 3: 6 x A100, 6 x A6000, 12 x L40 (24);
* setting 4: 3 x H100, 9 x A100 (12);
* setting 5: 4 x A100, 6 x L40, 10 x A6000 (20; 70% of the others' budget).

Bandwidths: Figure 4 draws each setting's GPU-to-GPU bandwidth matrix (Gbps, measured with NCCL)
as a picture; the text says only that the heterogeneous settings show "notable bandwidth
limitation and heterogeneity", and its numbers are not in the text we hold. The matrices here
are rebuilt from the link classes such a rental has, and are stated, not measured:

* inside a machine: NVLink for the SXM parts (H100 2,400 Gbps, A100 1,600 Gbps), PCIe 4.0 for
  the L40 and A6000 (128 Gbps);
* between machines of one data centre: 40 Gbps when both hold the same GPU type, 20 Gbps
  between types (different server racks);
* between the two data centres (the H100 / A100 one and the L40 / A6000 one): 5 Gbps, the
  "ultra-low cross data center communication" §5.2 says the plans avoid.

Machines are cut as Table 2's groups suggest (a machine holds at most 8 GPUs of one type); the A100
is the 80 GB part. Latency: 5 us over NVLink, 10 us over PCIe, 50 us inside a data centre, 5 ms
between them.

Workloads (§5.1): a prompt of more than 512 tokens is heavy prefill, more than 128 generated
tokens is heavy decode (Hu et al. 2024). Here heavy prompts are 1,024 tokens on average (512 to
1,536), light ones 256 (128 to 384); heavy decode 256 tokens, light 64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hexswarm.routing.scheduler.cluster import Cluster, Device
from hexswarm.routing.scheduler.gpu_catalog import lookup

GBPS = 1e9 / 8  # bytes/s in one Gbps

# GPU type -> (GPU-to-GPU bandwidth inside one machine in Gbps, latency in s)
SAME_MACHINE = {
    "H100": (2400.0, 5e-6),
    "A100-80G": (1600.0, 5e-6),
    "L40": (128.0, 1e-5),
    "A6000": (128.0, 1e-5),
}
SAME_TYPE_GBPS = 40.0  # two machines of one GPU type in one data centre
OTHER_TYPE_GBPS = 20.0  # two machines of different types in one data centre
CROSS_DC_GBPS = 5.0
SAME_DC_LATENCY_S = 5e-5
CROSS_DC_LATENCY_S = 5e-3
DATA_CENTRE = {"H100": "dc-sxm", "A100-80G": "dc-sxm", "L40": "dc-pcie", "A6000": "dc-pcie"}

# setting -> machines, each (GPU type, GPU count)
SETTINGS: dict[int, tuple[tuple[str, int], ...]] = {
    1: (("H100", 2), ("A100-80G", 4), ("A100-80G", 2), ("L40", 4), ("A6000", 4), ("A6000", 4)),
    2: (("H100", 3), ("A100-80G", 3), ("L40", 4), ("L40", 2), ("A6000", 4), ("A6000", 2)),
    3: (("A100-80G", 4), ("A100-80G", 2), ("A6000", 4), ("A6000", 2), ("L40", 4), ("L40", 4), ("L40", 4)),
    4: (("H100", 3), ("A100-80G", 4), ("A100-80G", 4), ("A100-80G", 1)),
    5: (("A100-80G", 4), ("L40", 4), ("L40", 2), ("A6000", 4), ("A6000", 4), ("A6000", 2)),
}

# workload -> (mean prompt tokens, generated tokens)
WORKLOADS: dict[str, tuple[int, int]] = {
    "HPLD": (1024, 64),
    "HPHD": (1024, 256),
    "LPHD": (256, 256),
    "LPLD": (256, 64),
}


def setting(number: int) -> Cluster:
    """Heterogeneous setting `number` (1 to 5) of Figure 4 as a Cluster (module docstring)."""
    if number not in SETTINGS:
        raise KeyError(f"unknown setting {number}; settings: {', '.join(map(str, SETTINGS))}")
    return rented_cluster(SETTINGS[number], f"s{number}")


def rented_cluster(machines: Sequence[tuple[str, int]], prefix: str = "c") -> Cluster:
    """Machines of (GPU type, count) with the links of the module docstring; GPU types among
    `SAME_MACHINE`'s. Device ids read `<prefix>-m<machine>-<type>-g<gpu>`."""
    devices = []
    for m, (gpu, count) in enumerate(machines):
        spec = lookup(gpu)
        machine = f"{prefix}-m{m}-{spec.name.lower()}"
        devices += [
            Device.from_spec(f"{machine}-g{i}", spec, machine, DATA_CENTRE[spec.name]) for i in range(count)
        ]
    bandwidth, latency = _matrices(devices)
    return Cluster(tuple(devices), latency, bandwidth)


def _matrices(devices: list[Device]) -> tuple[np.ndarray, np.ndarray]:
    """(bandwidth in bytes/s, latency in s), N x N, from the link classes of the module docstring."""
    n = len(devices)
    bandwidth = np.full((n, n), np.inf)
    latency = np.zeros((n, n))
    for i, a in enumerate(devices):
        for j, b in enumerate(devices):
            if i == j:
                continue
            if a.machine == b.machine:
                gbps, seconds = SAME_MACHINE[a.type]
            elif a.region == b.region:
                gbps = SAME_TYPE_GBPS if a.type == b.type else OTHER_TYPE_GBPS
                seconds = SAME_DC_LATENCY_S
            else:
                gbps, seconds = CROSS_DC_GBPS, CROSS_DC_LATENCY_S
            bandwidth[i, j], latency[i, j] = gbps * GBPS, seconds
    return bandwidth, latency
