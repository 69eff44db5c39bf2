"""Load simulator (routing.sim.load_sim): agrees with the route estimate alone, queues under load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hexswarm.routing.chains.cost import transfer_ms
from hexswarm.routing.chains.min_latency import MinLatencyRouter, min_latency_route
from hexswarm.routing.chains.routers import make_router
from hexswarm.routing.chains.swarm_view import PeerView, RouteRequest, SwarmView
from hexswarm.routing.scenarios.synthetic_swarm import SwarmSpec, generate_swarm
from hexswarm.routing.sim.load_sim import LoadSpec, compute_capacity, simulate_load, sustainable_rate

REQ = RouteRequest(prompt_tokens=8, new_tokens=4)


def test_one_request_takes_the_estimated_time() -> None:
    peers = (PeerView("a", 0, 2, 1e9, 3.0, 10_000), PeerView("b", 2, 4, 1e9, 5.0, 10_000))
    view = SwarmView(4, peers, client_rtt_ms={"a": 10.0, "b": 20.0}, hidden_size=512, dtype_bytes=2)
    route = min_latency_route(view, REQ)
    res = simulate_load(view, MinLatencyRouter(), LoadSpec(num_requests=1, request=REQ))
    prefill_extra = 2 * (transfer_ms(view, REQ, REQ.prompt_tokens) - transfer_ms(view, REQ))  # two hops
    expected_ms = (REQ.new_tokens + 1) * route.latency_ms + prefill_extra
    assert res.completed == 1
    assert res.mean_latency_s * 1e3 == pytest.approx(expected_ms)


def test_load_queues_and_every_mode_completes() -> None:
    view = generate_swarm(SwarmSpec(num_peers=30, seed=4))
    light = simulate_load(view, MinLatencyRouter(), LoadSpec(num_requests=40, rate_per_s=0.5, request=REQ))
    heavy = simulate_load(view, MinLatencyRouter(), LoadSpec(num_requests=40, rate_per_s=50.0, request=REQ))
    assert heavy.mean_latency_s > light.mean_latency_s
    for mode in ("max_throughput", "tradeoff"):
        kw = {"background": False} if mode == "tradeoff" else {}
        res = simulate_load(
            view, make_router(mode, **kw), LoadSpec(num_requests=40, rate_per_s=5.0, request=REQ)
        )
        assert res.completed == 40 and res.tokens_per_s > 0


def test_deterministic_for_a_seed() -> None:
    view = generate_swarm(SwarmSpec(num_peers=30, seed=4))
    spec = LoadSpec(num_requests=30, rate_per_s=5.0, request=REQ, seed=9)
    runs = [simulate_load(view, make_router("tradeoff", background=False, seed=1), spec) for _ in range(2)]
    assert runs[0] == runs[1]


def test_sustainable_rate_is_set_by_the_scarce_blocks() -> None:
    # batching peers that decode at their prefill rate: every token costs 1 / throughput
    fast = PeerView("a", 0, 4, 1000.0, 1.0, 10**6, decode_batch_size=8, decode_batch_tokens_per_s=1000.0)
    slow = PeerView("b", 2, 4, 10.0, 1.0, 10**6, decode_batch_size=8, decode_batch_tokens_per_s=10.0)
    view = SwarmView(4, (fast, slow), client_rtt_ms={"a": 100.0, "b": 100.0})
    # "a" runs 4 blocks at T, less the 10 block-tokens/s "b" takes: 4T - 10 <= 1000 (12 tokens a request)
    assert compute_capacity(view, REQ) * 12 == pytest.approx(252.5)
    # "a" decoding one session at a time at 1 ms a step is 1000 tokens/s too; at 250 it is less
    serial = SwarmView(4, (replace(fast, decode_batch_size=1, decode_batch_tokens_per_s=0.0), slow))
    assert compute_capacity(serial, REQ) == pytest.approx(compute_capacity(view, REQ))
    slow_decode = SwarmView(4, (replace(fast, decode_batch_tokens_per_s=250.0), slow))
    assert compute_capacity(slow_decode, REQ) < compute_capacity(view, REQ)
    tight = SwarmView(4, (replace(fast, cache_tokens_left=2 * 12), slow), client_rtt_ms=view.client_rtt_ms)
    assert sustainable_rate(tight, REQ) < sustainable_rate(view, REQ)  # blocks 0-1: two sessions at most
