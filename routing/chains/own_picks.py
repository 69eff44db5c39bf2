"""A client's own recent picks, added to the load of a stale snapshot (pure, no I/O).

Why: peers re-announce their load every few seconds, so a client routes many requests on
one snapshot. Scored on that snapshot alone, every one of them sees the same idle peers and
takes the same chain (or, with a random draw among near-best chains, some take slower ones:
the load test's 500-peer runs, where all 1,000 requests arrive within the first second,
lost p99 that way). The client does know what it has itself routed since the snapshot: a
session it opened is on those peers now, whatever the snapshot says. So the trade-off mode
adds its own picks since the snapshot to the announced `open_sessions` before scoring,
and each pick raises the load-aware cost (routing.chains.load_costs) of the peers it used.

A new snapshot version already counts those sessions, so the tally restarts with it. A
session that ends is taken off again (`release`): a client that runs one request after
another on a quiet swarm, whose snapshot may not change for minutes, would otherwise count
every request it ever made as load and spread its later ones over slower chains. A route
that a peer then refuses was still counted on its other peers until the session closed or
the next snapshot; that over-estimate is small and short-lived.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace

from hexswarm.routing.chains.swarm_view import Route, SwarmView


class OwnPicks:
    """Sessions this client routed per peer since the snapshot version it last routed on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = -1
        self._counts: dict[str, int] = {}
        self._routes: Counter[Route] = Counter()  # the routes counted since the snapshot

    def record(self, version: int, route: Route) -> None:
        """Counts one session on every peer of `route`, routed on snapshot `version`."""
        with self._lock:
            if version > self._version:
                self._version, self._counts, self._routes = version, {}, Counter()
            elif version < self._version:
                return  # routed on an older snapshot than the newest seen: the newer one counts it
            self._routes[route] += 1
            for peer_id in {h.peer_id for h in route.hops}:
                self._counts[peer_id] = self._counts.get(peer_id, 0) + 1

    def release(self, route: Route) -> None:
        """The session routed on `route` ended: it no longer counts, if it was counted on the
        current snapshot (a newer snapshot's announced load has it, or has it no more)."""
        with self._lock:
            if self._routes[route] <= 0:
                return
            self._routes[route] -= 1
            for peer_id in {h.peer_id for h in route.hops}:
                self._counts[peer_id] -= 1
                if self._counts[peer_id] <= 0:
                    del self._counts[peer_id]

    def counts(self, version: int) -> dict[str, int]:
        """peer_id -> sessions routed since snapshot `version` (empty for any other version)."""
        with self._lock:
            return dict(self._counts) if version == self._version else {}

    def loaded(self, view: SwarmView, counts: dict[str, int]) -> SwarmView:
        """`view` with `counts` added to its peers' open sessions."""
        if not counts:
            return view
        peers = tuple(
            replace(p, open_sessions=p.open_sessions + counts[p.peer_id]) if p.peer_id in counts else p
            for p in view.peers
        )
        return replace(view, peers=peers)
