"""Batched decode in the chain routers' load costs (honest accounting): a peer that
batches costs about one batched step per round of its sessions, one that does not k steps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hexswarm.client.peer_views import peer_view
from hexswarm.routing.chains.cost import candidates, make_route
from hexswarm.routing.chains.load_costs import (
    idle_step_ms,
    iteration_ms,
    load_aware_candidates,
    session_step_ms,
    utilisation,
)
from hexswarm.routing.chains.min_latency import MinLatencyRouter, shortest_chain
from hexswarm.routing.chains.swarm_view import PeerView, RouteRequest, SwarmView
from hexswarm.routing.scenarios.synthetic_swarm import SwarmSpec, generate_swarm
from hexswarm.routing.sim.load_sim import LoadSpec, simulate_load
from tests.unit.record_cases import make_record

REQ = RouteRequest(prompt_tokens=16, new_tokens=8)
SERIAL = PeerView("s", 0, 4, 10_000.0, 2.0, 10**6, open_sessions=6)
# 8 sessions in one step of 4 ms per block: 2000 tokens/s, where one at a time gives 500
BATCHED = replace(SERIAL, peer_id="b", decode_batch_size=8, decode_batch_tokens_per_s=2000.0)


def test_step_time_is_the_roofline_of_the_announced_figures() -> None:
    assert [SERIAL.step_ms_per_block(k) for k in (1, 2, 8)] == [2.0, 4.0, 16.0]
    assert [BATCHED.step_ms_per_block(k) for k in (1, 2, 8, 16)] == [2.0, 2.0, 4.0, 8.0]
    assert SERIAL.decode_tokens_per_s() == 500.0 and BATCHED.decode_tokens_per_s() == 2000.0


def test_a_batching_peer_costs_less_under_the_same_load() -> None:
    view = SwarmView(4, (SERIAL, BATCHED), client_rtt_ms={"s": 10.0, "b": 10.0})
    cands = candidates(view, REQ)
    rho = utilisation(cands, REQ, session_s=1.0)
    # per session: 16 prompt tokens at 10,000/s and 8 new ones at the decode rate, over 4 blocks
    assert rho == pytest.approx([6 * 4 * (16 / 1e4 + 8 / 500), 6 * 4 * (16 / 1e4 + 8 / 2000)])
    # the iteration in progress: one session's step on "s", the batch of all 6 on "b"
    assert iteration_ms(cands) == pytest.approx([4 * 2.0, 4 * max(2.0, 6e3 / 2000)])
    loaded = load_aware_candidates(view, REQ, step_ms=100.0)
    assert loaded.decode_ms[1] < loaded.decode_ms[0]


def test_an_idle_peer_costs_the_same_batching_or_not() -> None:
    view = SwarmView(4, (replace(SERIAL, open_sessions=0), replace(BATCHED, open_sessions=0)))
    loaded = load_aware_candidates(view, REQ, step_ms=100.0)
    assert loaded.decode_ms[0] == loaded.decode_ms[1] and loaded.overhead_ms[0] == loaded.overhead_ms[1]


def test_the_open_sessions_step_at_the_fixed_point_of_their_own_load() -> None:
    # One serial peer serves every block: its six sessions slow every step down, so they last
    # longer than six idle steps, and the load they make is lighter than the idle step implies.
    view = SwarmView(4, (replace(SERIAL, open_sessions=6),), client_rtt_ms={"s": 10.0})
    idle = idle_step_ms(view, REQ)
    step = session_step_ms(view, REQ)
    chain = shortest_chain(candidates(view, REQ))

    def priced(step_ms: float) -> float:  # the idle chain's step at the load a step of step_ms makes
        return make_route(load_aware_candidates(view, REQ, step_ms=step_ms), chain).latency_ms

    assert idle < step < priced(idle)
    assert priced(step) == pytest.approx(step, rel=2e-3)  # a fixed point
    assert load_aware_candidates(view, REQ).decode_ms == pytest.approx(
        load_aware_candidates(view, REQ, step_ms=step).decode_ms
    )
    idle_view = SwarmView(4, (replace(SERIAL, open_sessions=0),), client_rtt_ms={"s": 10.0})
    assert session_step_ms(idle_view, REQ) == pytest.approx(idle_step_ms(idle_view, REQ))


def test_the_simulator_runs_a_peer_that_does_not_batch_one_step_at_a_time() -> None:
    spec = LoadSpec(num_requests=60, rate_per_s=40.0, request=REQ, seed=1)
    batching = generate_swarm(SwarmSpec(num_peers=12, num_blocks=16, seed=2))
    serial = generate_swarm(SwarmSpec(num_peers=12, num_blocks=16, seed=2, batching=False))
    assert all(p.decode_batch_size > 1 or p.decode_ms_per_block * p.throughput <= 1e3 for p in batching.peers)
    assert all(p.decode_batch_tokens_per_s == 0 for p in serial.peers)
    fast = simulate_load(batching, MinLatencyRouter(), spec)
    slow = simulate_load(serial, MinLatencyRouter(), spec)
    assert slow.mean_latency_s > fast.mean_latency_s


def test_the_client_reads_the_batched_figures_from_records() -> None:
    batching = peer_view(make_record(open_sessions=3, decode_batch_size=8, decode_batch_tokens_per_s=4000.0))
    assert (batching.decode_batch_size, batching.decode_batch_tokens_per_s) == (8, 4000.0)
    assert batching.step_ms_per_block(3) == 1.5  # one read of the weights carries all three
    older = peer_view(make_record(open_sessions=3))  # announces no batch: one session at a time
    assert older.step_ms_per_block(3) == pytest.approx(4.5)
