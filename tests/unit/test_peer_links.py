"""Routes priced by the links a pushed chain crosses (routing/chains/peer_links.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hexswarm.routing.chains.cost import candidates, evaluate_assignments, route_from_assignment
from hexswarm.routing.chains.min_latency import min_latency_route
from hexswarm.routing.chains.peer_links import follow_matrix, links_from_reports, pair
from hexswarm.routing.chains.swarm_view import PeerView, RouteRequest, SwarmView
from tests.unit.router_cases import REQUEST, small_view, with_peer_links


def test_a_link_is_the_larger_of_both_ends_reports() -> None:
    links = links_from_reports(
        [
            ("a", [("b", 10.0), ("c", 40.0), ("a", 0.0)]),  # its own id: no link
            ("b", [("a", 30.0), ("c", 1e9), ("z", 5.0)]),  # past MAX_LINK_MS; z reports nothing
            ("c", []),
        ]
    )
    assert links == {pair("a", "b"): 30.0, pair("a", "c"): 40.0}


def test_no_measured_link_keeps_the_client_relayed_price() -> None:
    assert follow_matrix(["a", "b"], [20.0, 30.0], {pair("a", "x"): 5.0}) is None


def test_a_link_is_priced_one_way_and_never_below_the_triangle_floor() -> None:
    follow = follow_matrix(["a", "b", "c"], [20.0, 30.0, 90.0], {pair("a", "b"): 12.0, pair("a", "c"): 1.0})
    assert follow[0, 1] == follow[1, 0] == pytest.approx((12.0 - 20.0 - 30.0) / 2)
    # a's claim of 1 ms to c: the client sees them 70 ms apart, so the link is at least that
    assert follow[0, 2] == pytest.approx((70.0 - 20.0 - 90.0) / 2)
    assert follow[1, 2] == 0.0 and np.isinf(follow[2, 2])


@pytest.mark.parametrize("seed", range(10))
def test_population_scores_match_the_chains_they_build(seed: int) -> None:
    view = with_peer_links(small_view(seed), seed, share=0.8)
    cands = candidates(view, REQUEST)
    serving = cands.serves()
    if not serving.any(axis=0).all():
        return
    rng = np.random.default_rng(seed)
    assign = np.array(
        [[rng.choice(np.flatnonzero(serving[:, b])) for b in range(view.num_blocks)] for _ in range(30)]
    )
    scores = evaluate_assignments(cands, assign)
    for row, (latency, _) in zip(assign, scores, strict=True):
        assert route_from_assignment(cands, row).latency_ms == pytest.approx(latency, rel=1e-9)


def test_a_pushed_chain_takes_the_peers_near_each_other() -> None:
    # The client sits between two regions: a2 and b1 are each the closest to it, but 160 ms
    # apart, so a step pushed from a2 to b1 crosses that link. a1 and b1 share a region.
    peers = tuple(
        PeerView(p, s, e, 100.0, 1.0, 10_000) for p, s, e in [("a1", 0, 2), ("a2", 0, 2), ("b1", 2, 4)]
    )
    rtt = {"a1": 50.0, "a2": 40.0, "b1": 40.0}
    relayed = SwarmView(4, peers, client_rtt_ms=rtt)
    assert [h.peer_id for h in min_latency_route(relayed, RouteRequest(4, 4)).hops] == ["a2", "b1"]
    links = {pair("a1", "b1"): 10.0, pair("a2", "b1"): 160.0}
    pushed = SwarmView(4, peers, client_rtt_ms=rtt, peer_rtt_ms=links)
    route = min_latency_route(pushed, RouteRequest(4, 4))
    assert [h.peer_id for h in route.hops] == ["a1", "b1"]
    # one way: client -> a1 25, a1 -> b1 5, b1 -> client 20, and 4 blocks of 1 ms
    assert route.latency_ms == pytest.approx(25 + 5 + 20 + 4, abs=0.01)
