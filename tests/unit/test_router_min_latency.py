"""Exact min-latency chain (routing.chains.min_latency) against brute force, plus eligibility rules."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from hexswarm.routing.chains.cost import request_cache_tokens
from hexswarm.routing.chains.min_latency import MinLatencyRouter, min_latency_route
from hexswarm.routing.chains.swarm_view import NoRouteError, PeerView, RouteRequest, SwarmView
from hexswarm.routing.scenarios.synthetic_swarm import SwarmSpec, generate_swarm
from tests.unit.router_cases import REQUEST, all_routes, assert_covers, small_view, with_peer_links


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force(seed: int) -> None:
    view = small_view(seed)
    routes = all_routes(view, REQUEST)
    if not routes:
        with pytest.raises(NoRouteError):
            min_latency_route(view, REQUEST)
        return
    best = min(r.latency_ms for r in routes)
    route = MinLatencyRouter().choose(view, REQUEST)
    assert route.latency_ms == pytest.approx(best, rel=1e-9)
    assert_covers(route, view)


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_with_measured_peer_links(seed: int) -> None:
    view = with_peer_links(small_view(seed), seed)
    routes = all_routes(view, REQUEST)
    if not routes:
        return
    route = MinLatencyRouter().choose(view, REQUEST)
    assert route.latency_ms == pytest.approx(min(r.latency_ms for r in routes), rel=1e-9)
    assert_covers(route, view)
    assert all(a.peer_id != b.peer_id for a, b in zip(route.hops, route.hops[1:], strict=False))


def test_uses_sub_ranges() -> None:
    # A serves [0, 4) slowly, B serves [0, 2) fast, C serves [2, 4) fast: close fast peers win.
    peers = (
        PeerView("A", 0, 4, 100.0, 50.0, 10_000),
        PeerView("B", 0, 3, 100.0, 1.0, 10_000),
        PeerView("C", 1, 4, 100.0, 1.0, 10_000),
    )
    view = SwarmView(4, peers, client_rtt_ms={"A": 5.0, "B": 5.0, "C": 5.0})
    route = min_latency_route(view, REQUEST)
    assert [h.peer_id for h in route.hops] == ["B", "C"]
    assert_covers(route, view)


def test_cache_tokens_respected() -> None:
    need = request_cache_tokens(REQUEST)
    fast = PeerView("fast", 0, 4, 100.0, 0.1, need - 1)
    slow = PeerView("slow", 0, 4, 100.0, 9.0, need)
    route = min_latency_route(SwarmView(4, (fast, slow)), REQUEST)
    assert [h.peer_id for h in route.hops] == ["slow"]


def test_exclude_respected() -> None:
    view = generate_swarm(SwarmSpec(num_peers=60, seed=3))
    first = min_latency_route(view, REQUEST)
    banned = frozenset({first.hops[0].peer_id})
    second = min_latency_route(view, REQUEST, exclude=banned)
    assert banned.isdisjoint(h.peer_id for h in second.hops)
    assert second.latency_ms >= first.latency_ms
    assert_covers(second, view)


def test_no_route_names_missing_blocks() -> None:
    peers = (PeerView("a", 0, 3, 100.0, 1.0, 10_000), PeerView("b", 5, 8, 100.0, 1.0, 10_000))
    with pytest.raises(NoRouteError) as err:
        min_latency_route(SwarmView(8, peers), REQUEST)
    assert err.value.missing_blocks == [3, 4]
    assert "3-4" in str(err.value)
    with pytest.raises(NoRouteError) as err:
        min_latency_route(SwarmView(8, peers), REQUEST, exclude=frozenset({"b"}))
    assert err.value.missing_blocks == [3, 4, 5, 6, 7]


def test_route_estimates() -> None:
    peer = PeerView("a", 0, 4, 400.0, 2.0, 10_000, open_sessions=3)
    view = SwarmView(4, (peer,), client_rtt_ms={"a": 10.0}, hidden_size=1000, dtype_bytes=2)
    route = min_latency_route(view, RouteRequest(prompt_tokens=1, new_tokens=1, batch_size=1))
    transfer = 2 * 2000 * 8 / (view.client_bandwidth_mbps * 1e3)
    assert route.latency_ms == pytest.approx(10.0 + transfer + 8.0)
    assert route.throughput == pytest.approx(400.0 / 4 / 4)


def test_rejects_malformed_input() -> None:
    view = SwarmView(4, (PeerView("a", 2, 9, 100.0, 1.0, 10_000),))
    with pytest.raises(ValueError, match="range"):
        min_latency_route(view, REQUEST)
    with pytest.raises(ValueError, match="batch_size"):
        min_latency_route(replace(view, peers=()), RouteRequest(1, 1, batch_size=0))


def test_large_swarm_is_fast_and_covers() -> None:
    view = generate_swarm(SwarmSpec(num_peers=500, seed=1))
    route = min_latency_route(view, REQUEST)
    assert_covers(route, view)
    assert math.isfinite(route.latency_ms)
