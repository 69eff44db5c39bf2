"""Keep the idle chain's split when the load-aware chain runs on the same peers (pure, no I/O).

Why: the load-aware costs (routing.chains.load_costs) exist to choose *which* peers a
request should wait on. When the chain they pick runs on exactly the peers of the idle
min-latency chain (Petals' rule), every one of those peers gets this session either way,
so the load they see is the same; what differs is only where the boundaries between them
fall. The load-aware costs cannot judge that: they inflate a peer's per-block time by a
utilisation that assumes every open session runs its whole range, so a peer with a wider
range looks busier and loses blocks to its neighbour, though the same sessions load both.
The idle costs split blocks by each peer's measured step and round trip, which is what a
boundary move changes. (The load test showed it: at 10 peers and 0.9 of the sustainable
rate on seed 1, both modes used the same seven peers and the load-aware split lost 10% of
p99 latency; docs/routing.md "Where the load-aware costs must not decide".)

So the trade-off mode answers with the idle chain's hops whenever its pick uses the idle
chain's peers, with the estimate of those hops under the load-aware costs.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from hexswarm.routing.chains.cost import candidates, make_route
from hexswarm.routing.chains.load_costs import load_aware_candidates
from hexswarm.routing.chains.min_latency import shortest_chain
from hexswarm.routing.chains.swarm_view import Route, RouteRequest, SwarmView


def peers_of(route: Route) -> frozenset[str]:
    return frozenset(h.peer_id for h in route.hops)


class IdleChains:
    """The idle min-latency chain per (request, exclude) on the newest snapshot, solved once each.

    Idle costs ignore load, so within one snapshot version the chain never changes.
    """

    def __init__(self, max_entries: int = 256):
        self._lock = threading.Lock()
        self._version: int | None = None
        self._routes: dict[tuple[RouteRequest, frozenset[str]], Route | None] = {}
        self._max_entries = max_entries

    def route(self, view: SwarmView, request: RouteRequest, exclude: frozenset[str]) -> Route | None:
        key = (request, exclude)
        with self._lock:
            if view.version != self._version or len(self._routes) >= self._max_entries:
                self._version, self._routes = view.version, {}
            if key in self._routes:
                return self._routes[key]
        cands = candidates(view, request, exclude)
        hops = shortest_chain(cands)
        route = make_route(cands, hops) if hops is not None else None
        with self._lock:
            if view.version == self._version:
                self._routes[key] = route
        return route


def keep_idle_split(
    pick: Route, idle: Route | None, loaded: SwarmView, request: RouteRequest, step_ms: float | None
) -> Route:
    """`idle`'s hops, scored on the load-aware costs of `loaded`, when it runs on `pick`'s peers; else `pick`.

    step_ms: the snapshot's session step (routing.chains.load_costs.session_step_ms); None: idle's own step.
    """
    if idle is None or idle.hops == pick.hops or peers_of(idle) != peers_of(pick):
        return pick
    used = peers_of(idle)
    sub = replace(loaded, peers=tuple(p for p in loaded.peers if p.peer_id in used))
    cands = load_aware_candidates(sub, request, step_ms=idle.latency_ms if step_ms is None else step_ms)
    index = {p.peer_id: i for i, p in enumerate(cands.peers)}
    if len(index) != len(used):  # a peer of the chain is not eligible on `loaded`: keep the pick
        return pick
    return make_route(cands, [(index[h.peer_id], h.start, h.end) for h in idle.hops])
