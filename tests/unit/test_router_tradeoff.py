"""NSGA-II trade-off router (routing.chains.tradeoff, routing.chains.nsga): fronts, picks, cache, factory."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from hexswarm.routing.baselines.matrix_nsga import matrix_front
from hexswarm.routing.baselines.reference_front import hypervolume_2d
from hexswarm.routing.chains.cost import candidates, request_cache_tokens
from hexswarm.routing.chains.front import pick_index
from hexswarm.routing.chains.load_costs import load_aware_candidates
from hexswarm.routing.chains.min_latency import min_latency_route
from hexswarm.routing.chains.nsga import NsgaConfig, nsga_front
from hexswarm.routing.chains.routers import MODES, make_router
from hexswarm.routing.chains.swarm_view import NoRouteError, PeerView, RouteRequest, SwarmView
from hexswarm.routing.chains.tradeoff import DEFAULT_PREFERENCE, TradeoffRouter, request_class
from hexswarm.routing.scenarios.synthetic_swarm import SwarmSpec, generate_swarm
from tests.unit.router_cases import REQUEST, assert_covers

FAST = NsgaConfig(pop_size=16, generations=8)
VIEW = generate_swarm(SwarmSpec(num_peers=150, seed=7))


def test_front_is_non_dominated_covering_and_holds_min_latency() -> None:
    front = nsga_front(candidates(VIEW, REQUEST), FAST)
    assert len(front) >= 1
    assert np.all(np.diff(front.latency_ms) > 0) and np.all(np.diff(front.throughput) > 0)
    for route in front.routes:
        assert_covers(route, VIEW)
    assert front.latency_ms[0] == pytest.approx(min_latency_route(VIEW, REQUEST).latency_ms)


def test_seed_matrix_encoding_runs_and_covers() -> None:
    front = matrix_front(candidates(VIEW, REQUEST), FAST)
    for route in front.routes:
        assert_covers(route, VIEW)


def test_deterministic_for_a_seed() -> None:
    runs = [TradeoffRouter(config=FAST, seed=3, background=False) for _ in range(2)]
    picks = [[r.choose(VIEW, REQUEST) for _ in range(5)] for r in runs]
    assert picks[0] == picks[1]


def test_preference_ends_and_knee() -> None:
    lat, thr = np.array([1.0, 2.0, 3.0, 10.0]), np.array([1.0, 8.0, 9.0, 10.0])
    assert pick_index(lat, thr, 0.0) == 0
    assert pick_index(lat, thr, 1.0) == 3
    assert pick_index(lat, thr, None) == 1
    with pytest.raises(ValueError):
        pick_index(lat, thr, 1.5)
    assert hypervolume_2d(np.array([[0.0, 0.0]]), (1.0, 1.0)) == pytest.approx(1.0)


def test_cached_decision_is_fast_and_respects_exclude_and_cache() -> None:
    router = TradeoffRouter(config=FAST, background=False, account_picks=False)
    router.choose(VIEW, REQUEST)
    start = time.perf_counter()
    for _ in range(200):
        route = router.choose(VIEW, REQUEST)
    assert (time.perf_counter() - start) / 200 < 1e-3
    assert router.stats["hits"] >= 200
    banned = frozenset({route.hops[0].peer_id})
    assert banned.isdisjoint(h.peer_id for h in router.choose(VIEW, REQUEST, banned).hops)
    need = request_cache_tokens(REQUEST)
    for hop in route.hops:
        assert next(p for p in VIEW.peers if p.peer_id == hop.peer_id).cache_tokens_left >= need


def test_exclude_that_removes_the_preferred_chains_solves_again() -> None:
    """A refused peer must not send the request to a far end of the front: it gets the exact
    best chain without that peer, as min_latency would."""
    router = TradeoffRouter(config=FAST, background=False, spread=0.0, account_picks=False)
    banned = frozenset(h.peer_id for h in router.choose(VIEW, REQUEST).hops[:1])
    route = router.choose(VIEW, REQUEST, banned)
    best = router._fallback(VIEW, REQUEST, banned)
    assert banned.isdisjoint(h.peer_id for h in route.hops)
    assert route.latency_ms == pytest.approx(best.latency_ms)


def test_miss_answers_at_once_and_refreshes_in_background() -> None:
    router = TradeoffRouter(config=NsgaConfig(pop_size=40, generations=40))
    try:
        route = router.choose(VIEW, REQUEST)  # no front yet: exact fallback, NSGA-II queued
        assert_covers(route, VIEW)
        assert router.stats["misses"] == 1
        assert router.wait_idle(30.0) and router.cached_front(VIEW, REQUEST) is not None
        newer = replace(VIEW, version=VIEW.version + 1)
        assert router.cached_front(newer, REQUEST) is None  # a new snapshot is a miss ...
        router.choose(newer, REQUEST)
        assert router.wait_idle(30.0) and router.cached_front(newer, REQUEST) is not None  # ... refreshed
        assert router.cached_front(VIEW, REQUEST) is None  # older snapshot evicted
    finally:
        router.close()


def test_request_class_buckets_cache_need() -> None:
    assert request_class(RouteRequest(100, 20)) == request_class(
        RouteRequest(80, 30)
    )  # 120, 110 -> 128; 20, 30 -> 32
    assert request_class(RouteRequest(100, 20)) != request_class(RouteRequest(60, 50))  # new tokens 32 vs 64
    assert request_class(RouteRequest(100, 20)) != request_class(RouteRequest(100, 20, batch_size=2))


def test_no_route_error() -> None:
    router = TradeoffRouter(config=FAST, background=False)
    with pytest.raises(NoRouteError):
        router.choose(VIEW, REQUEST, exclude=frozenset(p.peer_id for p in VIEW.peers))


def test_factory() -> None:
    assert set(MODES) == {"min_latency", "max_throughput", "tradeoff"}
    for mode in MODES:
        router = make_router(mode, **({"background": False} if mode == "tradeoff" else {}))
        assert_covers(router.choose(VIEW, REQUEST), VIEW)
    assert make_router("tradeoff", 0.3).preference == 0.3
    with pytest.raises(ValueError, match="min_latency, max_throughput, tradeoff"):
        make_router("fastest")
    with pytest.raises(ValueError):
        make_router("min_latency", preference=0.5)
    with pytest.raises(ValueError):
        make_router("tradeoff", preference=2.0)


def test_load_aware_costs_steer_around_busy_peers() -> None:
    idle = (PeerView("a", 0, 4, 1000.0, 1.0, 10**6), PeerView("b", 0, 4, 1000.0, 1.2, 10**6))
    rtt = {"a": 5.0, "b": 5.0}
    view = SwarmView(4, idle, client_rtt_ms=rtt)
    assert [h.peer_id for h in min_latency_route(view, REQUEST).hops] == ["a"]
    busy = SwarmView(4, (replace(idle[0], open_sessions=50), idle[1]), client_rtt_ms=rtt)
    cands = load_aware_candidates(busy, REQUEST)
    assert cands.decode_ms[0] > cands.decode_ms[1] and cands.overhead_ms[0] > cands.overhead_ms[1]
    assert [h.peer_id for h in TradeoffRouter(config=FAST, background=False).choose(busy, REQUEST).hops] == [
        "b"
    ]
    assert [h.peer_id for h in min_latency_route(busy, REQUEST).hops] == ["a"]  # Petals' rule ignores load


def test_default_preference_and_knee() -> None:
    assert TradeoffRouter().preference == DEFAULT_PREFERENCE
    assert TradeoffRouter("knee", background=False).choose(VIEW, REQUEST) is not None
    with pytest.raises(ValueError):
        TradeoffRouter("elbow")


def test_balanced_placement_covers_the_edges() -> None:
    uniform = generate_swarm(SwarmSpec(num_peers=100, seed=0, placement="uniform"))
    balanced = generate_swarm(SwarmSpec(num_peers=100, seed=0))

    def fewest_peers(view) -> int:
        return min(sum(p.start <= b < p.end for p in view.peers) for b in range(view.num_blocks))

    assert fewest_peers(balanced) > fewest_peers(uniform)
