"""Pareto fronts of chains over (latency, load-adjusted throughput): filtering and picking.

The Explorative Study on distributed LLM techniques (§II-B1) keeps the non-dominated chains
and lets the user trade one objective for the other. Here a front is a tuple of routes sorted by latency (and so by throughput too).
`preference` in [0, 1] picks on it by the Chebyshev scalarisation of the normalised
objectives (0: least latency, 1: most throughput), which reaches every point of a front,
convex or not; with no preference we take the knee, the point farthest below the straight
line between the two ends.

The benchmark's reference front, and the hypervolume that measures a front against it, are
`routing/baselines/reference_front.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hexswarm.routing.chains.swarm_view import Route


@dataclass(frozen=True)
class Front:
    """Non-dominated routes sorted by latency, with arrays for fast picking."""

    routes: tuple[Route, ...]
    latency_ms: np.ndarray  # (k,)
    throughput: np.ndarray  # (k,)

    @staticmethod
    def of(routes: Sequence[Route]) -> Front:
        kept = pareto_filter(routes)
        return Front(
            routes=kept,
            latency_ms=np.array([r.latency_ms for r in kept], dtype=float),
            throughput=np.array([r.throughput for r in kept], dtype=float),
        )

    def __len__(self) -> int:
        return len(self.routes)


def pareto_filter(routes: Sequence[Route]) -> tuple[Route, ...]:
    """Routes no other route beats on both objectives, one per (latency, throughput), by latency."""
    ordered = sorted(routes, key=lambda r: (r.latency_ms, -r.throughput))
    kept: list[Route] = []
    for route in ordered:
        if not kept or route.throughput > kept[-1].throughput:
            kept.append(route)
    return tuple(kept)


def normalised(latency_ms: np.ndarray, throughput: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(u, v) in [0, 1]: u = 0 at the least latency, v = 0 at the most throughput."""
    span_l = float(np.ptp(latency_ms)) or 1.0
    span_t = float(np.ptp(throughput)) or 1.0
    return (latency_ms - latency_ms.min()) / span_l, (throughput.max() - throughput) / span_t


def pick_index(latency_ms: np.ndarray, throughput: np.ndarray, preference: float | None) -> int:
    """Index of the point chosen by `preference` (None: the knee)."""
    u, v = normalised(latency_ms, throughput)
    if preference is None:
        return int(np.argmin(u + v))  # farthest below the line u + v = 1 through both ends
    if not 0.0 <= preference <= 1.0:
        raise ValueError(f"preference must be in [0, 1], got {preference}")
    score = np.maximum((1 - preference) * u, preference * v)
    return int(np.lexsort((u if preference < 0.5 else v, score))[0])


def neighbours(latency_ms: np.ndarray, throughput: np.ndarray, index: int, radius: float) -> np.ndarray:
    """Indices of the points within `radius` of point `index` in normalised objective space."""
    u, v = normalised(latency_ms, throughput)
    return np.flatnonzero(np.hypot(u - u[index], v - v[index]) <= radius)
