"""Exact maximum-throughput chain (widest path), the Petals "max throughput" mode (Explorative Study, §II-B4).

A chain's throughput is its bottleneck: the smallest per-peer throughput after each peer's
current load is shared out (routing.chains.cost). Widest path over layer boundaries:

    best[0] = inf
    best[e] = max over peers i serving block e-1, s in [start_i, e) of
              min(best[s] (arrival not ending on i), capacity_i / (e - s))

That DP scores hop by hop, so a chain that returns to a peer (p, q, p) looks wider than it
is; we use it as an upper bound and binary-search the floor of the epsilon-constrained
shortest chain (routing.chains.min_latency.shortest_chain) below it. Many chains share the widest
bottleneck (short hops are cheap in throughput); that search returns the one with least
latency among them.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from hexswarm.routing.chains.cost import Candidates, candidates, make_route, no_route_error
from hexswarm.routing.chains.min_latency import Hops, shortest_chain
from hexswarm.routing.chains.swarm_view import Route, RouteRequest, SwarmView


def hop_widest_bottleneck(cands: Candidates) -> float:
    """Highest bottleneck over chains scored hop by hop (an upper bound; 0.0 when no chain).

    As in routing.chains.min_latency.shortest_chain, each boundary keeps its two best arrivals with
    different last peers, so a peer never follows itself (that would split one peer's work
    into two hops and fake a higher throughput).
    """
    num_blocks = cands.num_blocks
    best = np.zeros((num_blocks + 1, 2))  # [e, rank]: widest arrival, and widest with another last peer
    best[0, 0] = np.inf
    last = np.full((num_blocks + 1, 2), -1, dtype=np.int64)
    boundaries = np.arange(num_blocks)
    for e in range(1, num_blocks + 1):
        rows = np.flatnonzero((cands.start <= e - 1) & (e - 1 < cands.end))
        if rows.size == 0:
            return 0.0
        s = boundaries[None, :e]  # (1, e)
        base = np.where(last[None, :e, 0] == rows[:, None], best[None, :e, 1], best[None, :e, 0])  # (r, e)
        reach = np.minimum(base, cands.capacity[rows, None] / (e - s))
        reach = np.where(s >= cands.start[rows, None], reach, 0.0).max(axis=1)  # (r,) best per peer
        for rank, k in enumerate(np.argsort(-reach, kind="stable")[:2]):
            best[e, rank], last[e, rank] = reach[k], rows[k]
    return float(best[num_blocks, 0])


def _floors(cands: Candidates, low: float, high: float) -> np.ndarray:
    """Sorted distinct throughputs capacity_i / m (m blocks on peer i) in (low, high]."""
    spans = cands.end - cands.start
    per_peer = [cands.capacity[i] / np.arange(1, spans[i] + 1) for i in range(cands.size)]
    values = np.unique(np.concatenate(per_peer))
    return values[(values > low) & (values <= high * (1 + 1e-12))]


def widest_chain(cands: Candidates) -> Hops | None:
    """Min-latency chain among those with the highest bottleneck throughput found; None if no chain.

    The bottleneck of the best chain is some capacity_i / m, so we binary-search those values
    between the min-latency chain's bottleneck and the hop-by-hop upper bound, each probe
    an epsilon-constrained shortest chain (routing.chains.min_latency.shortest_chain).
    """
    best = shortest_chain(cands)
    if best is None:
        return None
    floors = _floors(cands, make_route(cands, best).throughput, hop_widest_bottleneck(cands))
    lo, hi = 0, len(floors)  # floors[:lo] reached, floors[hi:] not
    while lo < hi:
        mid = (lo + hi) // 2
        found = shortest_chain(cands, min_throughput=float(floors[mid]))
        if found is None:
            hi = mid
        else:
            best, lo = found, mid + 1
    return best


def max_throughput_route(
    view: SwarmView, request: RouteRequest, exclude: frozenset[str] = frozenset()
) -> Route:
    """The exact widest chain for `request` (ties: least latency), or NoRouteError."""
    cands = candidates(view, request, exclude)
    hops = widest_chain(cands)
    if hops is None:
        raise no_route_error(view, request, exclude, cands)
    return make_route(cands, hops)


class MaxThroughputRouter:
    """Router (see routing.chains.swarm_view.Router) that spreads load: the widest chain after current load.

    Short hops on lightly loaded peers raise the bottleneck, so its chains have more hops
    (and more latency) than the min-latency chain. The search takes up to a few hundred ms
    on 500 peers, so answers are kept per (snapshot version, request, exclude).
    """

    def __init__(self, max_entries: int = 64):
        self._cache: OrderedDict[tuple, Route] = OrderedDict()
        self._max_entries = max_entries

    def choose(self, view: SwarmView, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Route:
        key = (view.version, request, exclude)
        route = self._cache.get(key)
        if route is None:
            route = self._cache[key] = max_throughput_route(view, request, exclude)
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return route


def floor_route(cands: Candidates, preference: float | None) -> list[tuple[int, int, int]] | None:
    """Exact-solver fallback: min-latency chain whose bottleneck is >= a floor set by `preference`.

    The floor sits at that share of the way from the min-latency chain's bottleneck to the
    hop-by-hop widest bound (one DP, not the slower widest search); if no chain meets it,
    it comes down by halves, and in the end the min-latency chain answers.
    """
    fast = shortest_chain(cands)
    if fast is None:
        return None
    low = make_route(cands, fast).throughput
    gap = (0.5 if preference is None else preference) * max(0.0, hop_widest_bottleneck(cands) - low)
    for _ in range(4):
        hops = shortest_chain(cands, min_throughput=low + gap) if gap > 0 else None
        if hops is not None:
            return hops
        gap /= 2
    return fast
