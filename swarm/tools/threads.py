"""OpenMP settings for hexswarm's processes, applied before torch is imported.

A peer and a client often share a machine with each other and with other work. OpenMP's
default ACTIVE wait policy makes each idle torch thread spin for a while after every
parallel region, so co-located processes steal each other's cores between steps; PASSIVE
threads sleep instead. libgomp reads these variables once, when torch loads, so the
console scripts call `configure_openmp()` first thing. Values the user set are kept.

A program that imports torch before hexswarm's client (as most do) keeps libgomp's default,
spinning policy, and nothing can change it afterwards. `openmp_spins()` tells the client so,
and it then runs its own small per-token ops (embedding, norm, LM head) on one thread: with
one thread there is no idle team to spin while the client waits for the swarm, so the peers
computing the next step on the same machine keep their cores (docs/benchmarks.md "Concurrency").
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

_spins: bool | None = None  # decided by the first configure_openmp() call


def configure_openmp(threads: int | None = None) -> None:
    """Sets OMP_WAIT_POLICY=PASSIVE and, if `threads` is given, OMP_NUM_THREADS, unless the
    user already set them. Has no effect once torch is imported."""
    global _spins
    if _spins is None:
        _spins = "torch" in sys.modules and "OMP_WAIT_POLICY" not in os.environ
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if threads is not None:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def openmp_spins() -> bool:
    """True when torch was loaded before `configure_openmp()` ran and no OMP_WAIT_POLICY was
    set: this process's idle OpenMP threads then busy-wait after every op."""
    return bool(_spins)


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Runs the block with `threads` torch threads in the calling thread (None: unchanged)."""
    import torch

    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
