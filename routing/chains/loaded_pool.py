"""Decisions on one stale snapshot as this client's own picks pile up (pure, no I/O).

routing.chains.own_picks adds the client's own sessions since the snapshot to its load.
Every pick then changes the costs, and solving the exact DP again for every request costs
a few ms each. But within one snapshot loads only grow, so costs only rise: the least
latency of the last exact solve is a lower bound on every later one. So a decision
re-scores a small pool of chains (the cached front and the chains solved so far on this
snapshot) under the current tally, vectorised, and solves again only when the pool's best
is more than `tolerance` above that bound; otherwise the pool's best is within
`tolerance` of the exact optimum.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from hexswarm.routing.chains.cost import evaluate_assignments, make_route, no_route_error
from hexswarm.routing.chains.front import Front
from hexswarm.routing.chains.load_costs import load_aware_candidates
from hexswarm.routing.chains.min_latency import shortest_chain
from hexswarm.routing.chains.swarm_view import Route, RouteRequest, SwarmView

TOLERANCE = 0.02  # a pooled chain within 2% of the lower bound answers without a new solve


@dataclass
class Pool:
    """Chains worth re-scoring on one snapshot for one request, and the lower bound."""

    routes: list[Route]
    step_ms: float  # the snapshot's session step (routing.chains.load_costs.session_step_ms)
    bound_ms: float = 0.0  # least latency of the last exact solve without exclusions
    solves: int = field(default=0)


def loaded_front(pool: Pool, view: SwarmView, request: RouteRequest, exclude: frozenset[str]) -> Front:
    """The pool re-scored on `view` (own picks already added), with an exact solve when needed."""
    scored = _rescore(pool.routes, view, request, exclude, pool.step_ms)
    if len(scored) and scored.latency_ms[0] <= pool.bound_ms * (1 + TOLERANCE):
        return scored
    cands = load_aware_candidates(view, request, exclude, step_ms=pool.step_ms)
    hops = shortest_chain(cands)
    if hops is None:
        raise no_route_error(view, request, exclude, cands)
    best = make_route(cands, hops)
    pool.solves += 1
    if not exclude:  # a solve without some peers bounds nothing for requests that may use them
        pool.bound_ms = best.latency_ms
    pool.routes.append(best)
    return Front.of([best, *scored.routes])


def _rescore(
    routes: list[Route], view: SwarmView, request: RouteRequest, exclude: frozenset[str], step_ms: float
) -> Front:
    """Front of `routes` scored on load-aware costs of `view`, skipping routes through `exclude`."""
    used = {h.peer_id for r in routes for h in r.hops} - exclude
    sub = replace(view, peers=tuple(p for p in view.peers if p.peer_id in used))
    cands = load_aware_candidates(sub, request, step_ms=step_ms)  # only the pooled chains' peers
    index = {p.peer_id: i for i, p in enumerate(cands.peers)}
    kept = [r for r in routes if all(h.peer_id in index for h in r.hops)]
    if not kept:
        return Front.of([])
    assign = np.array([_assignment(r, index, view.num_blocks) for r in kept])
    objectives = evaluate_assignments(cands, assign)
    return Front.of(
        [
            replace(r, latency_ms=float(lat), throughput=float(-neg))
            for r, (lat, neg) in zip(kept, objectives, strict=True)
        ]
    )


def _assignment(route: Route, index: dict[str, int], num_blocks: int) -> np.ndarray:
    assign = np.empty(num_blocks, dtype=np.int64)
    for hop in route.hops:
        assign[hop.start : hop.end] = index[hop.peer_id]
    return assign
