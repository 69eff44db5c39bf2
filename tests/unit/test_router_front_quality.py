"""Front quality and own-pick accounting of the trade-off mode (routing.chains.sweep_seeds,
routing.chains.own_picks, routing.chains.loaded_pool)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hexswarm.routing.baselines.reference_front import normalised_hypervolume, sweep_front
from hexswarm.routing.chains.cost import candidates, evaluate_assignments, make_route, route_from_assignment
from hexswarm.routing.chains.idle_split import keep_idle_split
from hexswarm.routing.chains.load_costs import load_aware_candidates
from hexswarm.routing.chains.loaded_pool import TOLERANCE
from hexswarm.routing.chains.min_latency import min_latency_route, shortest_chain
from hexswarm.routing.chains.nsga import NsgaConfig, _assignment, nsga_front
from hexswarm.routing.chains.own_picks import OwnPicks
from hexswarm.routing.chains.relink import non_dominated, relink
from hexswarm.routing.chains.swarm_view import Hop, PeerView, Route, SwarmView
from hexswarm.routing.chains.sweep_seeds import sweep_seeds
from hexswarm.routing.chains.tradeoff import TradeoffRouter
from hexswarm.routing.scenarios.synthetic_swarm import SwarmSpec, generate_swarm
from tests.unit.router_cases import REQUEST, assert_covers

SMALL = generate_swarm(SwarmSpec(num_peers=40, num_blocks=40, seed=0))


def test_front_reaches_95_percent_of_the_sweep_hypervolume() -> None:
    cands = candidates(SMALL, REQUEST)
    sweep = sweep_front(cands)
    ours = nsga_front(cands, NsgaConfig(seed=0))
    assert normalised_hypervolume(ours, sweep) >= 0.95 * normalised_hypervolume(sweep, sweep)


def test_relink_keeps_every_point_it_was_given_or_one_that_dominates_it() -> None:
    cands = candidates(SMALL, REQUEST)
    seeds = np.array([_assignment(h, cands.num_blocks) for h in sweep_seeds(cands, solves=6)])
    start = non_dominated(cands, seeds)
    out = relink(cands, start)
    before, after = evaluate_assignments(cands, start), evaluate_assignments(cands, out)
    assert len(out) >= len(start)
    for lat, neg in before:  # both objectives minimised
        assert ((after[:, 0] <= lat) & (after[:, 1] <= neg)).any()
    assert np.all(np.diff(after[:, 0]) > 0) and np.all(np.diff(after[:, 1]) < 0)
    for row in out:
        assert_covers(route_from_assignment(cands, row), SMALL)


def test_sweep_seeds_start_at_the_exact_chain_and_stay_within_budget() -> None:
    cands = candidates(SMALL, REQUEST)
    seeds = sweep_seeds(cands, solves=6)
    assert 1 <= len(seeds) <= 6
    assert seeds[0] == shortest_chain(cands)
    with pytest.raises(ValueError):
        sweep_seeds(cands, solves=0)


def test_own_picks_count_per_snapshot_and_restart_with_a_new_one() -> None:
    picks = OwnPicks()
    route = TradeoffRouter(background=False, account_picks=False).choose(SMALL, REQUEST)
    picks.record(3, route)
    picks.record(3, route)
    peer = route.hops[0].peer_id
    assert picks.counts(3)[peer] == 2 and picks.counts(2) == {}
    loaded = picks.loaded(SMALL, picks.counts(3))
    assert next(p for p in loaded.peers if p.peer_id == peer).open_sessions == 2
    picks.record(4, route)
    assert picks.counts(4)[peer] == 1 and picks.counts(3) == {}


def test_a_session_that_ended_stops_counting() -> None:
    picks = OwnPicks()
    route = TradeoffRouter(background=False, account_picks=False).choose(SMALL, REQUEST)
    peer = route.hops[0].peer_id
    picks.record(3, route)
    picks.record(3, route)
    picks.release(route)
    assert picks.counts(3)[peer] == 1
    picks.release(route)
    picks.release(route)  # released more often than counted: nothing below zero
    assert picks.counts(3) == {}
    picks.record(3, route)
    picks.record(4, route)  # a new snapshot: what was counted on the old one is not released
    picks.release(route)
    assert picks.counts(4) == {}


def test_requests_one_after_another_take_the_same_best_chain() -> None:
    """A client that releases each session before the next routes them all on the best chain."""
    peers = (PeerView("a", 0, 4, 1000.0, 1.0, 10**6), PeerView("b", 0, 4, 1000.0, 1.0, 10**6))
    view = SwarmView(4, peers, client_rtt_ms={"a": 5.0, "b": 6.0})
    router = TradeoffRouter(config=NsgaConfig(pop_size=8, generations=2), background=False)
    for _ in range(10):
        route = router.choose(view, REQUEST)
        assert route.hops[0].peer_id == "a"
        router.release(route)


def test_requests_on_one_snapshot_spread_over_equal_chains() -> None:
    """Two equal peers: routing on one idle snapshot must not send everything to the first."""
    peers = (PeerView("a", 0, 4, 1000.0, 1.0, 10**6), PeerView("b", 0, 4, 1000.0, 1.0, 10**6))
    view = SwarmView(4, peers, client_rtt_ms={"a": 5.0, "b": 5.0})
    router = TradeoffRouter(config=NsgaConfig(pop_size=8, generations=2), background=False)
    used = [router.choose(view, REQUEST).hops[0].peer_id for _ in range(20)]
    assert 8 <= used.count("a") <= 12
    blind = TradeoffRouter(
        config=NsgaConfig(pop_size=8, generations=2), background=False, account_picks=False
    )
    assert {blind.choose(view, REQUEST).hops[0].peer_id for _ in range(20)} == {"a"}


def test_loaded_decisions_stay_within_tolerance_of_the_exact_chain() -> None:
    view = replace(generate_swarm(SwarmSpec(num_peers=60, seed=3)), version=7)
    router = TradeoffRouter(config=NsgaConfig(pop_size=16, generations=4), background=False)
    router.choose(view, REQUEST)  # the first decision on a snapshot comes from the cached front
    step_ms = next(iter(router._cache.values())).step_ms
    for _ in range(30):
        loaded = router._own.loaded(view, router._own.counts(view.version))
        exact = make_route(
            cands := load_aware_candidates(loaded, REQUEST, step_ms=step_ms), shortest_chain(cands)
        )
        route = router.choose(view, REQUEST)
        assert_covers(route, view)
        assert exact.latency_ms * (1 - 1e-9) <= route.latency_ms <= exact.latency_ms * (1 + TOLERANCE)
    assert router.stats["rescored"] == 30


@pytest.mark.parametrize("room, used", [(50, "a"), (40, "b")])
def test_a_peer_with_room_for_the_request_but_not_the_class_bound_is_used(room: int, used: str) -> None:
    """REQUEST takes 48 cache tokens; its class rounds that up to 64."""
    peers = (PeerView("a", 0, 4, 1000.0, 1.0, room), PeerView("b", 0, 4, 1000.0, 5.0, 10**6))
    view = SwarmView(4, peers, client_rtt_ms={"a": 5.0, "b": 5.0})
    router = TradeoffRouter(config=NsgaConfig(pop_size=8, generations=2), background=False)
    assert router.choose(view, REQUEST).hops[0].peer_id == used


def test_a_pick_on_the_idle_chains_peers_takes_the_idle_split() -> None:
    a = PeerView("a", 0, 3, 1000.0, 1.0, 10**6, open_sessions=30)
    b = PeerView("b", 1, 4, 1000.0, 1.2, 10**6)
    c = PeerView("c", 2, 4, 1000.0, 3.0, 10**6)
    view = SwarmView(4, (a, b, c), client_rtt_ms={"a": 5.0, "b": 5.0, "c": 5.0})
    idle = min_latency_route(view, REQUEST)
    assert [(h.peer_id, h.start, h.end) for h in idle.hops] == [("a", 0, 3), ("b", 3, 4)]
    moved = Route((Hop("a", 0, 1), Hop("b", 1, 4)), 0.0, 0.0)  # same peers, another cut
    kept = keep_idle_split(moved, idle, view, REQUEST, step_ms=None)
    assert kept.hops == idle.hops and kept.latency_ms > idle.latency_ms  # scored under load
    other = Route((Hop("a", 0, 2), Hop("c", 2, 4)), 0.0, 0.0)
    assert keep_idle_split(other, idle, view, REQUEST, step_ms=None) is other
