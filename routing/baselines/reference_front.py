"""The router benchmark's reference front of chains, and how a front is measured against it.

`sweep_front` is the reference: latency is a sum and throughput a bottleneck, so the
epsilon-constraint sweep (raise the throughput floor just above the last chain's bottleneck,
solve the floored shortest chain again) visits each trade-off once. It would be exact with an
exact floored solver; routing.chains.min_latency's is repaired, so a few of its points can be
dominated (the tests measure how many). The live router seeds NSGA-II with a short, budgeted
version of this sweep (routing.chains.sweep_seeds).

`normalised_hypervolume` scores a front (routing.chains.front.Front) by the area it dominates in
objectives normalised to the reference's ranges.
"""

from __future__ import annotations

import numpy as np

from hexswarm.routing.chains.cost import Candidates, make_route
from hexswarm.routing.chains.front import Front
from hexswarm.routing.chains.min_latency import shortest_chain
from hexswarm.routing.chains.swarm_view import Route

# Next floor = last bottleneck * (1 + this): strictly above it, far above float round-off.
_FLOOR_STEP = 1e-6


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
