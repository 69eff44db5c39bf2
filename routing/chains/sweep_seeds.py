"""A few epsilon-constraint solves spread along the front, to seed NSGA-II (pure, no I/O).

Why: the chains on the high-throughput half of the front have many short hops on distinct
peers, which random chains, hop mutation and crossover almost never assemble (at 500
peers NSGA-II alone covered a quarter of the sweep's hypervolume). The epsilon-constraint
sweep (routing.baselines.reference_front.sweep_front) finds them, but visits every trade-off, 100-200
solves. Here a fixed budget of solves is spent where it buys the most area:

1. climb: from the exact min-latency chain, raise the throughput floor by `growth` x the
   last chain's bottleneck until no chain meets it, or until it passes the hop-by-hop
   widest bound (routing.chains.max_throughput.hop_widest_bottleneck), the ceiling;
2. refine: split the gap whose staircase may lose the most normalised area (du * dv
   between two neighbours; above the widest chain found, du extrapolated from the last
   step) at its midpoint floor, until the budget is spent. The solve at a floor returns
   the fastest chain at or above it, so chains between the floor and that answer are
   dominated: the gap shrinks to the floor and, above the answer, to the next point.

NSGA-II then starts from these chains (Explorative Study, §II-B3's population, seeded) and fills the
gaps between them by crossover and mutation.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexswarm.routing.chains.cost import Candidates, make_route
from hexswarm.routing.chains.max_throughput import hop_widest_bottleneck
from hexswarm.routing.chains.min_latency import Hops, shortest_chain

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
    # No chain is wider than the hop-by-hop bound (one DP without repairs): floors above it
    # need no solve to fail.
    ceiling, used = hop_widest_bottleneck(cands) * (1 + _MIN_GAP), 1
    while used < solves and points[-1].throughput * growth < ceiling:  # 1. climb
        used += 1
        found = _solve(cands, points[-1].throughput * growth)
        if found is None:
            ceiling = points[-1].throughput * growth
            break
        points.append(found)
    gaps = [_Gap(low, high.throughput, high) for low, high in zip(points, points[1:], strict=False)]
    gaps.append(_Gap(points[-1], ceiling, None))
    while used < solves:  # 2. refine
        gap = max(gaps, key=lambda g: g.area(points))
        if gap.area(points) <= 0:
            break
        used += 1
        gaps.remove(gap)
        gaps += _split(gap, _solve(cands, (gap.low.throughput + gap.high) / 2), points)
    return [list(p.hops) for p in sorted(points, key=lambda p: p.throughput)]


@dataclass(frozen=True)
class _Gap:
    """Throughputs in (low.throughput, high) where the front may hold chains not found yet.

    upper: the chain found just above the gap (its latency bounds the gap's), None above the
    widest chain found.
    """

    low: _Point
    high: float
    upper: _Point | None

    def area(self, points: list[_Point]) -> float:
        """Normalised du * dv the staircase may lose in this gap (0 when too narrow to split)."""
        if self.high <= self.low.throughput * (1 + _MIN_GAP):
            return 0.0
        lats = [p.latency_ms for p in points]
        thrs = [p.throughput for p in points]
        span_l = (max(lats) - min(lats)) or 1.0
        span_t = (max(thrs) - min(thrs)) or 1.0
        dv = (self.high - self.low.throughput) / span_t
        if self.upper is not None:
            return (self.upper.latency_ms - self.low.latency_ms) / span_l * dv
        # beyond the widest chain found: assume the latency keeps rising as fast as below it
        below = [p for p in points if p.throughput < self.low.throughput]
        if not below:
            return dv  # only the fastest chain is known: the whole front is still to find
        prev = max(below, key=lambda p: p.throughput)
        slope = (
            (self.low.latency_ms - prev.latency_ms)
            / span_l
            / ((self.low.throughput - prev.throughput) / span_t)
        )
        return slope * dv * dv


def _split(gap: _Gap, found: _Point | None, points: list[_Point]) -> list[_Gap]:
    """The gaps left after solving at the gap's middle floor.

    The fastest chain with throughput >= floor is `found`, so chains in [floor, found) are
    dominated by it: what is left is (low, floor) and, above `found`, (found, high). No chain
    (the repaired solver found none) leaves (low, floor) only.
    """
    floor = (gap.low.throughput + gap.high) / 2
    if found is None:  # above the widest chain: a lower ceiling; inside: the repair missed, give up
        return [_Gap(gap.low, floor, None)] if gap.upper is None else []
    if gap.upper is not None and found.throughput >= gap.upper.throughput:  # the upper chain again
        return [_Gap(gap.low, floor, gap.upper)]
    points.append(found)
    return [_Gap(gap.low, floor, found), _Gap(found, gap.high, gap.upper)]


def _solve(cands: Candidates, floor: float) -> _Point | None:
    hops = shortest_chain(cands, min_throughput=floor)
    if hops is None:
        return None
    route = make_route(cands, hops)
    return _Point(route.latency_ms, route.throughput, tuple(hops))
