"""Exact minimum-latency chain: Petals' `find_best_chain` (seed 004, §II-A), made exact.

Why a DP and not a generic graph search: the nodes are the layer boundaries 0..L and an edge
is any contiguous sub-range [s, e) of what a peer serves, so there are O(n * L^2) edges. With
hop cost  a_i + d_i * (e - s)  (a_i: round trip + transfer, d_i: ms per block), the best
arrival at boundary e is

    dist[e] = min over peers i serving block e-1, s in window_i(e) of
              a_i + d_i * e + (dist[s] - d_i * s)

which is a windowed minimum per peer over boundaries that are already final (s < e), so one
sweep over e = 1..L, vectorised over peers, gives the exact optimum.

The window is [start_i, e) for plain min-latency. `shortest_chain(..., min_throughput=t)`
also solves the epsilon-constrained problem used by the other modes: a hop on peer i may
span at most capacity_i / t blocks, so every hop keeps throughput >= t.
"""

from __future__ import annotations

import numpy as np

from routing.chain_cost import Candidates, candidates, make_route, no_route_error
from routing.swarm_view import Route, RouteRequest, SwarmView

Hops = list[tuple[int, int, int]]  # (candidate index, start block, end block)

# Relative slack when comparing a hop's throughput with a threshold (float round-off only).
_THROUGHPUT_RTOL = 1e-9


def _max_hop_blocks(cands: Candidates, min_throughput: float) -> np.ndarray:
    """(n,) longest hop each candidate may run while keeping hop throughput >= min_throughput."""
    span = cands.end - cands.start
    if min_throughput <= 0:
        return span
    allowed = np.floor(cands.capacity / min_throughput * (1 + _THROUGHPUT_RTOL)).astype(np.int64)
    return np.minimum(span, allowed)


def shortest_chain(cands: Candidates, min_throughput: float = 0.0) -> Hops | None:
    """Exact min-latency chain whose hops all keep throughput >= min_throughput; None if none exists.

    Ties go to the candidate listed first, so the answer is deterministic for a given view.
    """
    num_blocks = cands.num_blocks
    if cands.size == 0:
        return None
    max_len = _max_hop_blocks(cands, min_throughput)
    dist = np.full(num_blocks + 1, np.inf)
    dist[0] = 0.0
    parent = np.full((num_blocks + 1, 2), -1, dtype=np.int64)  # boundary e -> (candidate, s)
    offsets = np.full((cands.size, num_blocks), np.inf)  # [i, s] = dist[s] - d_i * s
    boundaries = np.arange(num_blocks)
    for e in range(1, num_blocks + 1):
        offsets[:, e - 1] = dist[e - 1] - cands.decode_ms * (e - 1)
        rows = np.flatnonzero((cands.start <= e - 1) & (e - 1 < cands.end))
        if rows.size == 0:
            continue
        lo = np.maximum(cands.start[rows], e - max_len[rows])  # (r,) first allowed start
        window = np.where(boundaries[None, :e] >= lo[:, None], offsets[rows, :e], np.inf)  # (r, e)
        best_s = np.argmin(window, axis=1)
        cost = cands.overhead_ms[rows] + cands.decode_ms[rows] * e + window[np.arange(rows.size), best_s]
        k = int(np.argmin(cost))
        if np.isfinite(cost[k]):
            dist[e] = cost[k]
            parent[e] = (rows[k], best_s[k])
    if not np.isfinite(dist[num_blocks]):
        return None
    return _unwind(parent, num_blocks)


def _unwind(parent: np.ndarray, num_blocks: int) -> Hops:
    hops: Hops = []
    e = num_blocks
    while e > 0:
        i, s = (int(v) for v in parent[e])
        hops.append((i, s, e))
        e = s
    return hops[::-1]


def min_latency_route(view: SwarmView, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Route:
    """The exact min-latency chain for `request`, or NoRouteError naming the uncovered blocks."""
    cands = candidates(view, request, exclude)
    hops = shortest_chain(cands)
    if hops is None:
        raise no_route_error(view, request, exclude, cands)
    return make_route(cands, hops)


class MinLatencyRouter:
    """Router (see routing.swarm_view.Router) that always returns the exact min-latency chain.

    Stateless and deterministic; every client that uses it piles onto the same fastest
    peers, which is what the study's trade-off mode (seed 004, §II-B) sets out to fix.
    """

    def choose(self, view: SwarmView, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Route:
        return min_latency_route(view, request, exclude)
