"""OpenMP settings for hexswarm's processes, applied before torch is imported.

A peer and a client often share a machine with each other and with other work. OpenMP's
default ACTIVE wait policy makes each idle torch thread spin for a while after every
parallel region, so co-located processes steal each other's cores between steps; PASSIVE
threads sleep instead. libgomp reads these variables once, when torch loads, so the
console scripts call `configure_openmp()` first thing. Values the user set are kept.
"""

from __future__ import annotations

import os


def configure_openmp(threads: int | None = None) -> None:
    """Sets OMP_WAIT_POLICY=PASSIVE and, if `threads` is given, OMP_NUM_THREADS, unless the
    user already set them. Has no effect once torch is imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if threads is not None:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
