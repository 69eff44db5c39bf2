"""Small random swarms and a brute-force oracle for the router tests."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hexswarm.routing.chains.cost import candidates, make_route
from hexswarm.routing.chains.peer_links import pair
from hexswarm.routing.chains.swarm_view import PeerView, Route, RouteRequest, SwarmView

REQUEST = RouteRequest(prompt_tokens=16, new_tokens=8, batch_size=2)  # needs 48 cache tokens


def small_view(seed: int, num_peers: int = 6, num_blocks: int = 6, version: int = 0) -> SwarmView:
    """A random swarm small enough to enumerate every chain."""
    rng = np.random.default_rng(seed)
    peers = []
    for k in range(num_peers):
        start = int(rng.integers(0, num_blocks))
        end = int(rng.integers(start + 1, num_blocks + 1))
        peers.append(
            PeerView(
                peer_id=f"s{k}",
                start=start,
                end=end,
                throughput=float(rng.uniform(50, 2000)),
                decode_ms_per_block=float(rng.uniform(0.2, 20)),
                cache_tokens_left=int(rng.choice([10, 1000], p=[0.2, 0.8])),
                open_sessions=int(rng.integers(0, 4)),
            )
        )
    rtt = {p.peer_id: float(rng.uniform(1, 80)) for p in peers}
    return SwarmView(
        num_blocks, tuple(peers), client_rtt_ms=rtt, hidden_size=64, dtype_bytes=2, version=version
    )


def with_peer_links(view: SwarmView, seed: int, share: float = 0.5) -> SwarmView:
    """`view` with random measured round trips between about `share` of its pairs of peers."""
    rng = np.random.default_rng(seed + 1000)
    ids = [p.peer_id for p in view.peers]
    links = {
        pair(a, b): float(rng.uniform(1, 120))
        for k, a in enumerate(ids)
        for b in ids[k + 1 :]
        if a != b and rng.random() < share
    }
    return replace(view, peer_rtt_ms=links)


def all_routes(view: SwarmView, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> list[Route]:
    """Every chain over layer boundaries with any contiguous sub-range per hop (the oracle)."""
    cands = candidates(view, request, exclude)
    found: list[Route] = []

    def extend(boundary: int, hops: list[tuple[int, int, int]]) -> None:
        if boundary == view.num_blocks:
            found.append(make_route(cands, hops))
            return
        for i in range(cands.size):
            if cands.start[i] <= boundary < cands.end[i]:
                for e in range(boundary + 1, int(cands.end[i]) + 1):
                    extend(e, [*hops, (i, boundary, e)])

    extend(0, [])
    return found


def assert_covers(route: Route, view: SwarmView) -> None:
    """Hops are contiguous, cover [0, num_blocks) and stay inside what each peer serves."""
    by_id = {p.peer_id: p for p in view.peers}
    boundary = 0
    for hop in route.hops:
        peer = by_id[hop.peer_id]
        assert hop.start == boundary and hop.start < hop.end
        assert peer.start <= hop.start and hop.end <= peer.end
        boundary = hop.end
    assert boundary == view.num_blocks
