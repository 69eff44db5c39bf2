"""Exact minimum-latency chain: Petals' `find_best_chain` (Explorative Study, §II-A), made exact.

Why a DP and not a generic graph search: the nodes are the layer boundaries 0..L and an edge
is any contiguous sub-range [s, e) of what a peer serves, so there are O(n * L^2) edges. With
hop cost  a_i + d_i * (e - s)  (a_i: round trip + transfer, d_i: ms per block), the best
arrival at boundary e is

    dist[e] = min over peers i serving block e-1, s in window_i(e) of
              a_i + d_i * e + (dist[s] - d_i * s)

which is a windowed minimum per peer over boundaries that are already final (s < e), so one
sweep over e = 1..L, vectorised over peers, gives the exact optimum. On a pushed chain a hop on
i also pays its link from the hop before, f_ji (routing/chains/peer_links.py), so each boundary
keeps the best arrival through each last peer j and a hop on i starts from
min over j of arrival[s, j] + f_ji: an (m x n) minimum per boundary, m the peers reaching it.

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

    Each boundary keeps the best arrival through each last peer: a hop on peer i pays its link
    from the hop before it (`Candidates.follow_ms`, a measured peer-to-peer link on a pushed
    chain) and never follows itself (two hops in a row on one peer are never useful, and would
    dodge the bound). Ties go to the candidate listed first (deterministic). The tables persist
    between solves, so a repair round that bars peers from starting hops after boundary s
    recomputes only the boundaries after s + 1.
    """

    def __init__(self, cands: Candidates, max_len: np.ndarray):
        num_blocks, n = cands.num_blocks, cands.size
        self.cands, self.max_len = cands, max_len
        self.last_start = cands.end - 1  # latest boundary a hop on peer i may start at
        self.rows = [np.flatnonzero((cands.start <= b) & (b < cands.end)) for b in range(num_blocks)]
        self.follow = _follow_from(cands)  # None: no measured link, the best-two rule suffices
        # [e, j]: best chain to boundary e whose last hop is on j; column n: the client, at 0
        self.arrival = np.full((num_blocks + 1, n + 1), np.inf)
        self.arrival[0, n] = 0.0
        self.parent = np.full((num_blocks + 1, n, 2), -1, dtype=np.int64)  # [e, i] -> (s, last peer at s)
        # [i, s] = best arrival at s a hop on i may take - d_i * s
        self.offsets = np.full((n, num_blocks), np.inf)
        self.came_from = np.full((n, num_blocks), n, dtype=np.int64)  # [i, s]: that arrival's last peer

    def solve(self, first: int = 1) -> Hops | None:
        """Recomputes boundaries first..L (those before are final) and unwinds the best chain."""
        cands, num_blocks = self.cands, self.cands.num_blocks
        if cands.size == 0:
            return None
        self.arrival[first:], self.parent[first:] = np.inf, -1
        boundaries = np.arange(num_blocks)
        for e in range(first, num_blocks + 1):
            self._open_boundary(e - 1)
            rows = self.rows[e - 1]
            lo = np.maximum(cands.start[rows], e - self.max_len[rows])  # (r,) first allowed start
            b = boundaries[None, :e]
            allowed = (b >= lo[:, None]) & (b <= self.last_start[rows, None])
            window = np.where(allowed, self.offsets[rows, :e], np.inf)  # (r, e)
            best_s = np.argmin(window, axis=1) if rows.size else rows
            cost = cands.overhead_ms[rows] + cands.decode_ms[rows] * e + window[np.arange(rows.size), best_s]
            self.arrival[e, rows] = cost
            self.parent[e, rows, 0] = best_s
            self.parent[e, rows, 1] = self.came_from[rows, best_s]
        final = self.arrival[num_blocks, : cands.size]
        if not np.isfinite(final).any():
            return None
        return self._unwind(int(np.argmin(final)))

    def _open_boundary(self, s: int) -> None:
        """Boundary s is final: record, per peer, the best arrival a hop on that peer may start from."""
        reached = np.flatnonzero(np.isfinite(self.arrival[s]))
        d = self.cands.decode_ms
        if reached.size == 0:
            self.offsets[:, s] = np.inf
            return
        if self.follow is None:  # no links: the best arrival, its runner-up for its own peer
            self._open_without_links(s, reached)
            return
        totals = self.arrival[s, reached][:, None] + self.follow[reached]  # (m, n): via each last peer
        best = np.argmin(totals, axis=0)
        self.offsets[:, s] = totals[best, np.arange(d.size)] - d * s
        self.came_from[:, s] = reached[best]

    def _open_without_links(self, s: int, reached: np.ndarray) -> None:
        order = reached[np.argsort(self.arrival[s, reached], kind="stable")[:2]]
        d = self.cands.decode_ms
        self.offsets[:, s] = self.arrival[s, order[0]] - d * s
        self.came_from[:, s] = order[0]
        j = order[0]
        if j < d.size:  # peer j may not follow itself: it gets the runner-up arrival
            second = self.arrival[s, order[1]] if order.size > 1 else np.inf
            self.offsets[j, s] = second - d[j] * s
            self.came_from[j, s] = order[1] if order.size > 1 else d.size

    def _unwind(self, last: int) -> Hops:
        hops: Hops = []
        e, i = self.cands.num_blocks, last
        while e > 0:
            s, before = (int(v) for v in self.parent[e, i])
            hops.append((i, s, e))
            e, i = s, before
        return hops[::-1]


def _follow_from(cands: Candidates) -> np.ndarray | None:
    """(n + 1, n): ms a hop on i pays after one on j (+inf on the diagonal: never itself); the
    last row is the client, nothing before. None when no link is measured."""
    if cands.follow_ms is None:
        return None
    return np.vstack([cands.follow_ms, np.zeros((1, cands.size))])


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
