"""Pareto fronts of chains over (latency, load-adjusted throughput): filtering, picking, measuring.

Seed 004 (§II-B1) keeps the non-dominated chains and lets the user trade one objective for
the other. Here a front is a tuple of routes sorted by latency (and so by throughput too).
`preference` in [0, 1] picks on it by the Chebyshev scalarisation of the normalised
objectives (0: least latency, 1: most throughput), which reaches every point of a front,
convex or not; with no preference we take the knee, the point farthest below the straight
line between the two ends.

`sweep_front` is the reference front of the benchmark: latency is a sum and throughput a
bottleneck, so the epsilon-constraint sweep (raise the throughput floor just above the last
chain's bottleneck, solve the floored shortest chain again) visits each trade-off once. It
would be exact with an exact floored solver; routing.chains.min_latency's is repaired, so a few of
its points can be dominated (the tests measure how many).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from routing.chains.cost import Candidates, make_route
from routing.chains.min_latency import shortest_chain
from routing.chains.swarm_view import Route

# Next floor = last bottleneck * (1 + this): strictly above it, far above float round-off.
_FLOOR_STEP = 1e-6


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


def sweep_front(cands: Candidates, max_points: int = 1000) -> Front:
    """The front of the epsilon-constraint sweep (the benchmark's reference; see the module docstring)."""
    routes: list[Route] = []
    floor = 0.0
    while len(routes) < max_points:
        hops = shortest_chain(cands, min_throughput=floor)
        if hops is None:
            break
        route = make_route(cands, hops)
        routes.append(route)
        floor = route.throughput * (1 + _FLOOR_STEP)
    return Front.of(routes)


def hypervolume_2d(points: np.ndarray, ref: tuple[float, float]) -> float:
    """Area dominated by `points` (k, 2), both objectives minimised, bounded by `ref`."""
    inside = points[(points[:, 0] < ref[0]) & (points[:, 1] < ref[1])]
    if inside.size == 0:
        return 0.0
    inside = inside[np.lexsort((inside[:, 1], inside[:, 0]))]
    area, best_y = 0.0, ref[1]
    for x, y in inside:
        if y < best_y:
            area += (ref[0] - x) * (best_y - y)
            best_y = y
    return float(area)


def normalised_hypervolume(front: Front, reference: Front) -> float:
    """Hypervolume of `front` in objectives normalised to `reference`'s ranges, ref point (1.1, 1.1).

    Both fronts are scaled by the same (reference) ranges, so comparing the reference's own
    figure with another front's is fair; points beyond the reference's ends count in full.
    """
    if len(front) == 0 or len(reference) == 0:
        return 0.0
    lat0, lat_span = reference.latency_ms.min(), float(np.ptp(reference.latency_ms)) or 1.0
    thr0, thr_span = reference.throughput.max(), float(np.ptp(reference.throughput)) or 1.0
    pts = np.column_stack([(front.latency_ms - lat0) / lat_span, (thr0 - front.throughput) / thr_span])
    return hypervolume_2d(pts, (1.1, 1.1))
