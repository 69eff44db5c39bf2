"""A few epsilon-constraint solves spread along the front, to seed NSGA-II (pure, no I/O).

Why: the chains on the high-throughput half of the front have many short hops on distinct
peers, which random chains, hop mutation and crossover almost never assemble (at 500
peers NSGA-II alone covered a quarter of the sweep's hypervolume). The epsilon-constraint
sweep (routing.chains.front.sweep_front) finds them, but visits every trade-off, 100-200
solves. Here a fixed budget of solves is spent where it buys the most area:

1. climb: from the exact min-latency chain, raise the throughput floor by `growth` x the
   last chain's bottleneck until no chain meets it (that floor is a ceiling);
2. refine: split the gap whose staircase loses the most normalised area (du * dv between
   two neighbours, or between the widest chain found and the ceiling) at its midpoint
   floor, until the budget is spent.

NSGA-II then starts from these chains (seed 004, §II-B3's population, seeded) and fills the
gaps between them by crossover and mutation.
"""

from __future__ import annotations

from dataclasses import dataclass

from routing.chains.cost import Candidates, make_route
from routing.chains.min_latency import Hops, shortest_chain

# A gap to the ceiling narrower than this share of the widest chain found is not worth a solve.
_MIN_GAP = 1e-3


@dataclass(frozen=True)
class _Point:
    latency_ms: float
    throughput: float
    hops: tuple[tuple[int, int, int], ...]


def sweep_seeds(cands: Candidates, solves: int = 16, growth: float = 1.5) -> list[Hops]:
    """Up to `solves` chains along the (latency, throughput) front, min-latency chain first."""
    if solves < 1 or growth <= 1.0:
        raise ValueError(f"need solves >= 1 and growth > 1, got {solves}, {growth}")
    fast = _solve(cands, 0.0)
    if fast is None:
        return []
    points = [fast]
    ceiling, used = float("inf"), 1
    while used < solves and ceiling == float("inf"):  # 1. climb
        used += 1
        found = _solve(cands, points[-1].throughput * growth)
        if found is None:
            ceiling = points[-1].throughput * growth
        else:
            points.append(found)
    closed: set[float] = set()  # lower ends of gaps that a solve could not split
    while used < solves:  # 2. refine
        gap = _widest_gap(points, ceiling, closed)
        if gap is None:
            break
        low, high = gap
        used += 1
        floor = (low.throughput + high) / 2
        found = _solve(cands, floor)
        if found is None:
            if high == ceiling:
                ceiling = floor
            else:
                closed.add(low.throughput)
        elif any(p.throughput == found.throughput for p in points):
            closed.add(low.throughput)
        else:
            points = sorted([*points, found], key=lambda p: p.throughput)
    return [list(p.hops) for p in points]


def _solve(cands: Candidates, floor: float) -> _Point | None:
    hops = shortest_chain(cands, min_throughput=floor)
    if hops is None:
        return None
    route = make_route(cands, hops)
    return _Point(route.latency_ms, route.throughput, tuple(hops))


def _widest_gap(points: list[_Point], ceiling: float, closed: set[float]) -> tuple[_Point, float] | None:
    """(lower point, upper throughput) of the open gap with the largest normalised du * dv."""
    top = points[-1].throughput if ceiling == float("inf") else ceiling
    span_t = (top - points[0].throughput) or 1.0
    span_l = (max(p.latency_ms for p in points) - points[0].latency_ms) or 1.0
    best, best_area = None, 0.0
    for low, high in zip(points, points[1:], strict=False):
        area = abs(high.latency_ms - low.latency_ms) / span_l * (high.throughput - low.throughput) / span_t
        if low.throughput not in closed and area > best_area:
            best, best_area = (low, high.throughput), area
    if ceiling != float("inf") and ceiling > points[-1].throughput * (1 + _MIN_GAP):
        # beyond the widest chain found: assume the latency keeps rising as fast as the last step
        area = (ceiling - points[-1].throughput) / span_t * 0.5
        if area > best_area:
            best = (points[-1], ceiling)
    return best
