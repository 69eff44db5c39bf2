"""Which devices a peer's ranks run on (`--tp`, `--devices`), and what the hardware is.

Device lists are checked before anything loads, so a typo costs a second, not a model load.
What goes into the peer's record is read from the hardware itself, never assumed.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from hexswarm.swarm.trust.records import DeviceInfo


class DeviceError(ValueError):
    """A device list that cannot run: missing, repeated, mixed or of the wrong length."""


def parse_devices(text: str | None, tp: int, default: str) -> tuple[torch.device, ...]:
    """The device of each rank, from `--devices` (comma-separated) or from `--device`.

    Without `--devices`, a CPU peer runs every rank on the CPU (threads split between them)
    and a GPU peer of degree K takes cuda:0 .. cuda:K-1.
    """
    if tp < 1:
        raise DeviceError(f"--tp must be at least 1, got {tp}")
    if text is None:
        base = _device(default)
        if base.type == "cuda" and tp > 1:
            names = [f"cuda:{i}" for i in range(tp)]
        else:
            names = [default] * tp
    else:
        names = [name.strip() for name in text.split(",")]
        if any(not name for name in names):
            raise DeviceError(f"a device is missing in --devices {text!r} (an empty name between commas)")
        if len(names) != tp:
            raise DeviceError(f"--tp {tp} needs {tp} devices, but --devices names {len(names)}: {text!r}")
    devices = tuple(_device(name) for name in names)
    _check(devices, tp)
    return devices


def _device(name: str) -> torch.device:
    try:
        return torch.device(name)
    except (RuntimeError, ValueError):
        raise DeviceError(f"{name!r} is not a device name (expected cpu, cuda or cuda:N)") from None


def _check(devices: tuple[torch.device, ...], tp: int) -> None:
    kinds = {d.type for d in devices}
    if len(kinds) > 1:
        raise DeviceError(f"the ranks of one peer must share a device type, got {sorted(kinds)}")
    kind = kinds.pop()
    if kind == "cpu":
        return  # several CPU ranks share the cores (see threads_per_rank)
    if kind != "cuda":
        raise DeviceError(f"device type {kind!r} is not supported (cpu or cuda)")
    if tp > 1 and any(d.index is None for d in devices):
        raise DeviceError("with --tp above 1, name each GPU with its index, e.g. --devices cuda:0,cuda:1")
    seen: set[int] = set()
    for d in devices:
        if d.index in seen:
            raise DeviceError(f"{d} is given twice in --devices: each rank needs its own GPU")
        seen.add(d.index)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for d in devices:
        index = 0 if d.index is None else d.index
        if index >= count:
            have = f"{count} GPUs (cuda:0..cuda:{count - 1})" if count else "no CUDA GPU"
            raise DeviceError(f"{d} is missing: this machine has {have}")


def cpu_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# A decode step whose largest matmul is below this many multiply-adds per token (hidden x
# intermediate) runs faster on one thread: waking a sleeping (OMP_WAIT_POLICY=PASSIVE) helper
# thread for each ~20 us op costs more than it saves (docs/benchmarks.md "Concurrency").
SMALL_MODEL_MACS = 1 << 20


def default_cpu_threads(config) -> int:
    """run-peer's torch threads on CPU when --threads is not given: 1 for small models, else every core."""
    macs = config.hidden_size * getattr(config, "intermediate_size", 4 * config.hidden_size)
    return 1 if macs < SMALL_MODEL_MACS else cpu_cores()


def threads_per_rank(devices: tuple[torch.device, ...]) -> int | None:
    """CPU ranks split the cores evenly (one rank per core at least); None on GPU (torch's default)."""
    if devices[0].type != "cpu":
        return None
    return max(1, cpu_cores() // len(devices))


def describe(device: torch.device, threads: int | None) -> DeviceInfo:
    """What this rank runs on, read from the hardware."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return DeviceInfo(
            type="cuda",
            name=props.name,
            memory_bytes=int(props.total_memory),
            cores=props.multi_processor_count,
        )
    return DeviceInfo(type="cpu", name=_cpu_name(), memory_bytes=_ram_bytes(), cores=threads or cpu_cores())


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
