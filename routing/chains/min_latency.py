"""Exact minimum-latency chain: Petals' `find_best_chain` (Explorative Study, §II-A), made exact.

Why a DP and not a generic graph search: the nodes are the layer boundaries 0..L and an edge
is any contiguous sub-range [s, e) of what a peer serves, so there are O(n * L^2) edges. With
hop cost  a_i + d_i * (e - s)  (a_i: round trip + transfer, d_i: ms per block), the best
arrival at boundary e is

    dist[e] = min over peers i serving block e-1, s in window_i(e) of
              a_i + d_i * e + (dist[s] - d_i * s)

which is a windowed minimum per peer over boundaries that are already final (s < e), so one
sweep over e = 1..L, vectorised over peers, gives the exact optimum.

The window is [start_i, e) for plain min-latency, which is exact. `shortest_chain(...,
min_throughput=t)` solves the epsilon-constrained problem the other modes use: peer i may run
at most capacity_i / t blocks of the chain. The DP bounds each hop; a chain that comes back
to a peer (p, q, p) could still exceed that peer's total, so we then forbid the peers that
came back to start a hop after their first one and solve again (a repair: what it returns always meets the
floor, but it may miss the best such chain; the tests measure how often). Every peer that
came back is barred at once: fewer rounds, a little less reach.
"""

from __future__ import annotations

import numpy as np

from hexswarm.routing.chains.cost import Candidates, candidates, make_route, no_route_error
from hexswarm.routing.chains.swarm_view import Route, RouteRequest, SwarmView

Hops = list[tuple[int, int, int]]  # (candidate index, start block, end block)

# Relative slack when comparing a hop's throughput with a threshold (float round-off only).
_THROUGHPUT_RTOL = 1e-9


def _max_blocks(cands: Candidates, min_throughput: float) -> np.ndarray:
    """(n,) most blocks each candidate may run in a chain while keeping throughput >= min_throughput."""
    span = cands.end - cands.start
    if min_throughput <= 0:
        return span
    allowed = np.floor(cands.capacity / min_throughput * (1 + _THROUGHPUT_RTOL)).astype(np.int64)
    return np.minimum(span, allowed)


def shortest_chain(cands: Candidates, min_throughput: float = 0.0) -> Hops | None:
    """Min-latency chain in which every peer keeps throughput >= min_throughput; None if none found.

    Exact for min_throughput == 0; with a floor, repaired as the module docstring says.
    """
    dp = _ChainDP(cands, _max_blocks(cands, min_throughput))
    first = 1  # boundaries before this one are unchanged since the last round
    while True:
        hops = dp.solve(first)
        if hops is None or min_throughput <= 0:
            return hops
        ids = [i for i, _, _ in hops]
        blocks = np.bincount(ids, weights=[e - s for _, s, e in hops], minlength=cands.size)
        if not (blocks > dp.max_len).any():
            return hops
        barred = {i: min(s for j, s, _ in hops if j == i) for i in set(ids) if ids.count(i) > 1}
        for i, s in barred.items():  # keep its first hop, forbid it to come back
            dp.last_start[i] = s
        # Only hops on a barred peer that start after s change: they end at s + 2 or later.
        first = min(barred.values()) + 2


class _ChainDP:
    """Exact min-latency chain whose hop on peer i spans at most max_len[i] blocks from s <= last_start[i].

    Two hops in a row on one peer are never useful (one hop does the same work for one
    round trip less) but would dodge the bound, so each boundary keeps its two best
    arrivals with different last peers, and a hop on peer i extends the best arrival whose
    last peer is not i. Ties go to the candidate listed first (deterministic). The tables
    persist between solves, so a repair round that bars peers from starting hops after
    boundary s recomputes only the boundaries after s + 1.
    """

    def __init__(self, cands: Candidates, max_len: np.ndarray):
        num_blocks, n = cands.num_blocks, cands.size
        self.cands, self.max_len = cands, max_len
        self.last_start = cands.end - 1  # latest boundary a hop on peer i may start at
        self.rows = [np.flatnonzero((cands.start <= b) & (b < cands.end)) for b in range(num_blocks)]
        self.dist = np.full((num_blocks + 1, 2), np.inf)  # [e, rank]: best, and best with another last peer
        self.dist[0, 0] = 0.0
        self.last = np.full((num_blocks + 1, 2), -1, dtype=np.int64)  # last peer of each arrival
        self.parent = np.full((num_blocks + 1, 2, 2), -1, dtype=np.int64)  # [e, rank] -> (s, rank at s)
        self.offsets = np.full((n, num_blocks), np.inf)  # [i, s] = arrival at s usable by i - d_i * s
        self.rank_at = np.zeros((n, num_blocks), dtype=np.int64)  # which arrival at s that was

    def solve(self, first: int = 1) -> Hops | None:
        """Recomputes boundaries first..L (those before are final) and unwinds the best chain."""
        cands, num_blocks = self.cands, self.cands.num_blocks
        if cands.size == 0:
            return None
        self.dist[first:], self.last[first:], self.parent[first:] = np.inf, -1, -1
        boundaries = np.arange(num_blocks)
        for e in range(first, num_blocks + 1):
            _open_boundary(cands, self.dist, self.last, self.offsets, self.rank_at, e - 1)
            rows = self.rows[e - 1]
            lo = np.maximum(cands.start[rows], e - self.max_len[rows])  # (r,) first allowed start
            b = boundaries[None, :e]
            allowed = (b >= lo[:, None]) & (b <= self.last_start[rows, None])
            window = np.where(allowed, self.offsets[rows, :e], np.inf)  # (r, e)
            best_s = np.argmin(window, axis=1) if rows.size else rows
            cost = cands.overhead_ms[rows] + cands.decode_ms[rows] * e + window[np.arange(rows.size), best_s]
            for rank, k in enumerate(np.argsort(cost, kind="stable")[:2]):
                if np.isfinite(cost[k]):
                    self.dist[e, rank], self.last[e, rank] = cost[k], rows[k]
                    self.parent[e, rank] = (best_s[k], self.rank_at[rows[k], best_s[k]])
        if not np.isfinite(self.dist[num_blocks, 0]):
            return None
        return _unwind(self.last, self.parent, num_blocks)


def _open_boundary(cands: Candidates, dist, last, offsets, rank_at, s: int) -> None:
    """Boundary s is final: record, per peer, the arrival a hop on that peer may start from."""
    offsets[:, s] = dist[s, 0] - cands.decode_ms * s
    rank_at[:, s] = 0
    j = last[s, 0]
    if j >= 0:  # peer j may not follow itself: it gets the runner-up arrival
        offsets[j, s] = dist[s, 1] - cands.decode_ms[j] * s
        rank_at[j, s] = 1


def _unwind(last: np.ndarray, parent: np.ndarray, num_blocks: int) -> Hops:
    hops: Hops = []
    e, rank = num_blocks, 0
    while e > 0:
        s, prev_rank = (int(v) for v in parent[e, rank])
        hops.append((int(last[e, rank]), s, e))
        e, rank = s, prev_rank
    return hops[::-1]


def min_latency_route(view: SwarmView, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Route:
    """The exact min-latency chain for `request`, or NoRouteError naming the uncovered blocks."""
    cands = candidates(view, request, exclude)
    hops = shortest_chain(cands)
    if hops is None:
        raise no_route_error(view, request, exclude, cands)
    return make_route(cands, hops)


class MinLatencyRouter:
    """Router (see routing.chains.swarm_view.Router) that always returns the exact min-latency chain.

    Stateless and deterministic; every client that uses it piles onto the same fastest
    peers, which is what the study's trade-off mode (Explorative Study, §II-B) sets out to fix.
    """

    def choose(self, view: SwarmView, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Route:
        return min_latency_route(view, request, exclude)
