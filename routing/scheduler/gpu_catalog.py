"""Catalog of common accelerators: memory, memory bandwidth and dense FP16 tensor throughput.

These are the three device figures HexGen's cost model needs (§4.1: M_d memory limit, m_d
memory bandwidth, c_d tensor core computation power). Figures are vendor datasheet peaks:
memory in GiB (what the driver reports, e.g. 24576 MiB for a "24 GB" card), bandwidth in GB/s
(1e9 bytes/s), FP16 tensor TFLOPS *dense* (no 2:4 sparsity) with FP32 accumulate, which is
what PyTorch's fp16 matmul uses. Override any of them per device in the cluster file.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures of one accelerator model."""

    name: str
    memory_gib: float  # device memory, GiB
    memory_bandwidth_gbps: float  # GB/s (1e9 bytes per second)
    tflops: float  # dense FP16 tensor TFLOPS (1e12 FLOP/s)

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.memory_bandwidth_gbps * 1e9

    @property
    def flops(self) -> float:
        return self.tflops * 1e12


_SPECS = (
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, 3.35 TB/s, FP16 tensor 1,979 TFLOPS with sparsity.
    GpuSpec("H100", 80, 3350, 989.5),
    # NVIDIA H100 datasheet (PCIe): 80 GB HBM2e, 2.0 TB/s, FP16 tensor 1,513 TFLOPS with sparsity.
    GpuSpec("H100-PCIE", 80, 2000, 756.5),
    # NVIDIA A100 datasheet (SXM 40GB): HBM2 1,555 GB/s, FP16 tensor 312 TFLOPS dense.
    GpuSpec("A100-40G", 40, 1555, 312),
    # NVIDIA A100 datasheet (SXM 80GB): HBM2e 2,039 GB/s, FP16 tensor 312 TFLOPS dense.
    GpuSpec("A100-80G", 80, 2039, 312),
    # NVIDIA RTX A6000 datasheet: 48 GB GDDR6, 768 GB/s, FP16 tensor 309.7 TFLOPS with sparsity.
    GpuSpec("A6000", 48, 768, 154.8),
    # NVIDIA RTX A5000 datasheet: 24 GB GDDR6, 768 GB/s, tensor 222.2 TFLOPS with sparsity.
    GpuSpec("A5000", 24, 768, 111.1),
    # NVIDIA RTX A4000 datasheet: 16 GB GDDR6, 448 GB/s, tensor 153.4 TFLOPS with sparsity.
    GpuSpec("A4000", 16, 448, 76.7),
    # NVIDIA A40 datasheet: 48 GB GDDR6, 696 GB/s, FP16 tensor 299.4 TFLOPS with sparsity.
    GpuSpec("A40", 48, 696, 149.7),
    # NVIDIA A10 datasheet: 24 GB GDDR6, 600 GB/s, FP16 tensor 250 TFLOPS with sparsity.
    GpuSpec("A10", 24, 600, 125),
    # NVIDIA L40 datasheet: 48 GB GDDR6, 864 GB/s, FP16 tensor 362.1 TFLOPS with sparsity.
    GpuSpec("L40", 48, 864, 181),
    # NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, FP16 tensor 733 TFLOPS with sparsity.
    GpuSpec("L40S", 48, 864, 366),
    # NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, FP16 tensor 242 TFLOPS with sparsity.
    GpuSpec("L4", 24, 300, 121),
    # NVIDIA T4 datasheet: 16 GB GDDR6, 320 GB/s, 65 TFLOPS mixed precision (FP16/FP32).
    GpuSpec("T4", 16, 320, 65),
    # NVIDIA V100 SXM2 datasheet: 32 GB HBM2, 900 GB/s, 125 tensor TFLOPS.
    GpuSpec("V100", 32, 900, 125),
    # NVIDIA Ampere GA102 whitepaper, Appendix A: RTX 3090 936 GB/s, FP16 tensor with FP32 accumulate 71 TFLOPS.
    GpuSpec("RTX3090", 24, 936, 71),
    # GeForce RTX 3090 Ti spec page: 24 GB GDDR6X at 21 Gbps x 384 bit = 1,008 GB/s; GA102 full chip at
    # 1.86 GHz boost gives 80 TFLOPS FP16 tensor with FP32 accumulate (160 with FP16 accumulate).
    GpuSpec("RTX3090TI", 24, 1008, 80),
    # NVIDIA Ada Lovelace whitepaper, Appendix A: RTX 4090 1,008 GB/s, FP16 tensor with FP32 accumulate 165.2 TFLOPS.
    GpuSpec("RTX4090", 24, 1008, 165.2),
    # A CPU as a device, from figures measured on the 2-core AMD EPYC development VM with numpy
    # (2048x2048 fp32 matmul: 95 GFLOP/s; 2 GiB array copy: 32 GB/s read+write; 23.5 GiB RAM).
    # Describe your own CPU with `cpu_spec()` or per-device overrides in the cluster file.
    GpuSpec("CPU", 23.5, 32, 0.095),
)

# Accepted spellings -> catalog name (matched after upper-casing and removing spaces, '_' and '-').
_ALIASES = {
    "H100SXM": "H100",
    "H100SXM5": "H100",
    "H100PCIE": "H100-PCIE",
    "A100": "A100-40G",
    "A10040G": "A100-40G",
    "A10040GB": "A100-40G",
    "A10080G": "A100-80G",
    "A10080GB": "A100-80G",
    "RTXA6000": "A6000",
    "RTXA5000": "A5000",
    "RTXA4000": "A4000",
    "3090": "RTX3090",
    "3090TI": "RTX3090TI",
    "4090": "RTX4090",
    "GEFORCERTX3090": "RTX3090",
    "GEFORCERTX3090TI": "RTX3090TI",
    "GEFORCERTX4090": "RTX4090",
    "TESLAT4": "T4",
}

CATALOG: dict[str, GpuSpec] = {spec.name: spec for spec in _SPECS}


def _key(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch not in " _-")


_BY_KEY = {_key(spec.name): spec.name for spec in _SPECS} | _ALIASES


class UnknownGpuError(ValueError):
    """A device type that is not in the catalog and has no figures of its own."""


def lookup(name: str) -> GpuSpec:
    """Returns the catalog entry for a GPU name such as "A6000", "rtx 3090 ti" or "A100-40G"."""
    canonical = _BY_KEY.get(_key(name))
    if canonical is None:
        known = ", ".join(sorted(CATALOG))
        raise UnknownGpuError(
            f"unknown GPU type {name!r}; known types: {known} (or give memory_gb, "
            "memory_bandwidth_gbps and tflops for the device)"
        )
    return CATALOG[canonical]


def cpu_spec(memory_gib: float, memory_bandwidth_gbps: float, gflops: float, name: str = "CPU") -> GpuSpec:
    """A CPU described from measured figures: RAM for the model, copy bandwidth, matmul GFLOP/s."""
    if memory_gib <= 0 or memory_bandwidth_gbps <= 0 or gflops <= 0:
        raise ValueError("CPU figures must be positive")
    return GpuSpec(name, memory_gib, memory_bandwidth_gbps, gflops / 1000.0)
