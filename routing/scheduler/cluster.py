"""Devices and the network between them (HexGen §4.1: D, M_d, m_d, c_d and the matrices A, B).

A cluster is a tuple of devices plus two N x N matrices: latency alpha (seconds) and bandwidth
beta (bytes/s). The matrices are usually expanded from three link classes (same machine, same
region, across regions) and per-region-pair overrides, which is how `from_dict` reads the
cluster file of `hexswarm plan`:

    {"devices": [{"id": "a0", "type": "A6000", "machine": "m1", "region": "illinois"}, ...],
     "network": {"same_machine": {"latency_ms": 0.01, "bandwidth_gbps": 128},
                 "same_region":  {"latency_ms": 2, "bandwidth_gbps": 5},
                 "cross_region": {"latency_ms": 100, "bandwidth_gbps": 0.5},
                 "overrides": [{"regions": ["iceland", "norway"], "latency_ms": 40, "bandwidth_gbps": 1.0}]}}

A device may replace its catalog figures with `memory_gb` (GiB), `memory_bandwidth_gbps`
(GB/s) and `tflops`; a device whose type is not in the catalog must give all three. A device
may name the format it stores its weights in, `"quant": "int8"` (one of
`weight_formats.QUANT_FORMATS`; "none", the compute dtype, when absent): the memory model counts
its layers at that format's bytes per weight (`cost_model.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from hexswarm.routing.scheduler.gpu_catalog import GIB, GpuSpec, UnknownGpuError, lookup
from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT, UnknownQuantError, check_quant


class ClusterError(ValueError):
    """The cluster description is malformed or inconsistent."""


@dataclass(frozen=True)
class Device:
    """One accelerator (or CPU) that can serve layers."""

    id: str
    type: str
    machine: str
    region: str
    memory_bytes: float  # M_d
    bandwidth: float  # m_d, bytes/s
    flops: float  # c_d, FLOP/s
    quant: str = DEFAULT_QUANT  # the format its layers' weights are stored in (`weight_formats.py`)
    # Bytes one layer's weights take on it, as a peer measured them (swarm/coordinator/); 0: the
    # model's layer at `quant`'s bytes per weight (`cost_model.device_layer_bytes`).
    weight_bytes_per_layer: float = 0.0

    def __post_init__(self) -> None:
        check_quant(self.quant)

    @classmethod
    def from_spec(
        cls, id: str, spec: GpuSpec, machine: str, region: str, quant: str = DEFAULT_QUANT
    ) -> Device:
        return cls(
            id, spec.name, machine, region, spec.memory_bytes, spec.bandwidth_bytes_s, spec.flops, quant
        )


@dataclass(frozen=True)
class Link:
    """Latency (seconds) and bandwidth (bytes/s) of one class of link."""

    latency_s: float
    bandwidth: float

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> Link:
        if not isinstance(raw, dict):
            raise ClusterError(f"{where} must be an object with latency_ms and bandwidth_gbps")
        latency_ms = _number(raw, "latency_ms", where, minimum=0.0)
        gbps = _number(raw, "bandwidth_gbps", where, minimum=1e-9)
        return cls(latency_ms / 1000.0, gbps * 1e9 / 8)


# Defaults: PCIe 4.0 x16 inside a machine (~16 GB/s achieved); HexGen footnote 3 for the rest.
DEFAULT_SAME_MACHINE = Link(1e-5, 16e9)
DEFAULT_SAME_REGION = Link(2e-3, 5e9 / 8)
DEFAULT_CROSS_REGION = Link(0.1, 0.5e9 / 8)


@dataclass(frozen=True)
class Network:
    """Link classes, plus overrides keyed by an unordered pair of regions."""

    same_machine: Link = DEFAULT_SAME_MACHINE
    same_region: Link = DEFAULT_SAME_REGION
    cross_region: Link = DEFAULT_CROSS_REGION
    region_pairs: tuple[tuple[str, str, Link], ...] = ()

    def link(self, a: Device, b: Device) -> Link:
        if a.machine == b.machine and a.region == b.region:
            return self.same_machine
        for r1, r2, link in self.region_pairs:
            if {r1, r2} == {a.region, b.region}:
                return link
        return self.same_region if a.region == b.region else self.cross_region


@dataclass(frozen=True, eq=False)
class Cluster:
    """Devices and their communication matrices: latency[i, j] in s, bandwidth[i, j] in bytes/s."""

    devices: tuple[Device, ...]
    latency: np.ndarray  # (N, N) alpha
    bandwidth: np.ndarray  # (N, N) beta; inf on the diagonal
    network: Network | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        n = len(self.devices)
        if self.latency.shape != (n, n) or self.bandwidth.shape != (n, n):
            raise ClusterError(f"latency and bandwidth must be {n} x {n} matrices")
        ids = [d.id for d in self.devices]
        if len(set(ids)) != n:
            raise ClusterError("device ids must be unique")

    def __len__(self) -> int:
        return len(self.devices)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices)

    def index(self, device_id: str) -> int:
        position = self._positions.get(device_id)
        if position is None:
            raise KeyError(f"no device {device_id!r} in the cluster")
        return position

    @cached_property
    def _positions(self) -> dict[str, int]:
        return {d.id: i for i, d in enumerate(self.devices)}

    def subset(self, keep_ids: set[str] | frozenset[str]) -> Cluster:
        """The cluster restricted to `keep_ids` (what is left after devices leave)."""
        rows = [i for i, d in enumerate(self.devices) if d.id in keep_ids]
        idx = np.ix_(rows, rows)
        return Cluster(
            tuple(self.devices[i] for i in rows), self.latency[idx], self.bandwidth[idx], self.network
        )

    def without(self, leaving: set[str] | frozenset[str]) -> Cluster:
        return self.subset({d.id for d in self.devices if d.id not in leaving})

    def with_quant(self, quant: str) -> Cluster:
        """The cluster as if every device stored its weights in `quant` (`hexswarm plan --quant`)."""
        check_quant(quant)
        devices = tuple(replace(d, quant=quant, weight_bytes_per_layer=0.0) for d in self.devices)
        return Cluster(devices, self.latency.copy(), self.bandwidth.copy(), self.network)

    def with_devices(self, added: list[Device]) -> Cluster:
        """The cluster after `added` join; needs the `network` it was built with."""
        if self.network is None:
            raise ClusterError("this cluster has no link classes to place new devices with")
        return build_cluster(list(self.devices) + list(added), self.network)

    @classmethod
    def from_dict(cls, raw: Any) -> Cluster:
        """Parses the cluster-file format in the module docstring; raises ClusterError."""
        if not isinstance(raw, dict) or not isinstance(raw.get("devices"), list) or not raw["devices"]:
            raise ClusterError('the cluster file must be an object with a non-empty "devices" list')
        devices = [_device_from_dict(item, i) for i, item in enumerate(raw["devices"])]
        return build_cluster(devices, _network_from_dict(raw.get("network", {})))


def build_cluster(devices: list[Device], network: Network) -> Cluster:
    """Expands link classes into the N x N matrices."""
    n = len(devices)
    latency = np.zeros((n, n))
    bandwidth = np.full((n, n), np.inf)
    for i, a in enumerate(devices):
        for j in range(i + 1, n):
            link = network.link(a, devices[j])
            latency[i, j] = latency[j, i] = link.latency_s
            bandwidth[i, j] = bandwidth[j, i] = link.bandwidth
    return Cluster(tuple(devices), latency, bandwidth, network)


def _number(raw: dict, key: str, where: str, minimum: float) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
        raise ClusterError(f"{where}: {key} must be a number >= {minimum:g}, got {value!r}")
    return float(value)


def _device_from_dict(raw: Any, position: int) -> Device:
    where = f"devices[{position}]"
    if not isinstance(raw, dict):
        raise ClusterError(f"{where} must be an object")
    for key in ("id", "type"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ClusterError(f"{where} needs a non-empty string {key!r}")
    device_id, gpu_type = raw["id"], raw["type"]
    machine = str(raw.get("machine", device_id))
    region = str(raw.get("region", "default"))
    overrides = {k: raw[k] for k in ("memory_gb", "memory_bandwidth_gbps", "tflops") if k in raw}
    try:
        spec = lookup(gpu_type)
    except UnknownGpuError:
        if len(overrides) < 3:
            raise ClusterError(
                f"{where} ({device_id}): unknown GPU type {gpu_type!r} and no memory_gb, "
                "memory_bandwidth_gbps and tflops given"
            ) from None
        spec = GpuSpec(gpu_type, 1.0, 1.0, 1.0)
    memory = _number(raw, "memory_gb", where, 1e-6) * GIB if "memory_gb" in raw else spec.memory_bytes
    bandwidth = (
        _number(raw, "memory_bandwidth_gbps", where, 1e-6) * 1e9
        if "memory_bandwidth_gbps" in raw
        else spec.bandwidth_bytes_s
    )
    flops = _number(raw, "tflops", where, 1e-9) * 1e12 if "tflops" in raw else spec.flops
    return Device(device_id, spec.name, machine, region, memory, bandwidth, flops, _quant(raw, where))


def _quant(raw: dict, where: str) -> str:
    """The device's weight format: "quant" if it names a known one, "none" when absent."""
    try:
        return check_quant(raw.get("quant", DEFAULT_QUANT))
    except UnknownQuantError as exc:
        raise ClusterError(f"{where} ({raw['id']}): {exc}") from None


def _network_from_dict(raw: Any) -> Network:
    if not isinstance(raw, dict):
        raise ClusterError('"network" must be an object')
    same_machine = (
        Link.from_dict(raw["same_machine"], "network.same_machine") if "same_machine" in raw else None
    )
    same_region = Link.from_dict(raw["same_region"], "network.same_region") if "same_region" in raw else None
    cross = Link.from_dict(raw["cross_region"], "network.cross_region") if "cross_region" in raw else None
    pairs = []
    overrides = raw.get("overrides", [])
    if not isinstance(overrides, list):
        raise ClusterError('"network.overrides" must be a list')
    for i, item in enumerate(overrides):
        where = f"network.overrides[{i}]"
        regions = item.get("regions") if isinstance(item, dict) else None
        if not isinstance(regions, list) or len(regions) != 2 or not all(isinstance(r, str) for r in regions):
            raise ClusterError(f'{where} needs "regions": [two region names]')
        pairs.append((regions[0], regions[1], Link.from_dict(item, where)))
    return Network(
        same_machine or DEFAULT_SAME_MACHINE,
        same_region or DEFAULT_SAME_REGION,
        cross or DEFAULT_CROSS_REGION,
        tuple(pairs),
    )
