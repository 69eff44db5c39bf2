"""Clients choosing chains: min_latency clients pile onto the fastest peer; tradeoff clients spread.

Two parallel peers serve the whole model with the same throughput, but "slow" announces a
decode time per block 20x longer than "fast" (`run-peer --decode-ms`, as an operator with a
slower card would measure; announced rather than measured so the test does not depend on
this machine's noisy timings). Each client holds its session open while the next one
routes, and waits until the peers' records show that load.
"""

import contextlib
import time

import pytest
import torch

from hexswarm.swarm.trust.records import read_peer_records

pytestmark = pytest.mark.integration


def _peers_of(route: str) -> tuple[str, ...]:
    """'fast[0:2) -> slow[2:4)' -> ('fast', 'slow')"""
    return tuple(hop.split("[")[0] for hop in route.split(" -> "))


def _wait_for_sessions(client, name: str, sessions: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        records = read_peer_records(client.swarm.dht, client.spec.model_id)
        if any(r.name == name and r.open_sessions >= sessions for r in records):
            return
        assert time.monotonic() < deadline, f"{name} never announced {sessions} open sessions"
        time.sleep(0.3)


def _routes_of_two_clients(swarm, model_dir, **client_kwargs) -> list[tuple[str, ...]]:
    from hexswarm.client import DistributedModelForCausalLM

    clients = [
        DistributedModelForCausalLM.from_pretrained(
            model_dir, initial_peers=swarm.initial_peers, **client_kwargs
        )
        for _ in range(2)
    ]
    used: list[tuple[str, ...]] = []
    try:
        with contextlib.ExitStack() as sessions:
            for client in clients:
                sessions.enter_context(client.inference_session(max_length=8))
                client(torch.tensor([[5, 6, 7]]))  # opens the session and keeps it open
                used.append(_peers_of(client.last_route))
                for name in used[-1]:
                    _wait_for_sessions(client, name, sum(name in route for route in used))
    finally:
        for client in clients:
            client.shutdown()
    return used


@pytest.fixture(scope="module")
def parallel_peers(shared_swarm, make_model):
    model_dir = make_model(arch="llama", layers=4, seed=3)
    figures = {
        "fast": ("--throughput", "1000", "--decode-ms", "0.5"),
        "slow": ("--throughput", "1000", "--decode-ms", "10"),
    }
    peers = [
        shared_swarm.local.start_peer(model_dir, "0:4", name, "--announce-period", "1", *flags, wait=False)
        for name, flags in figures.items()
    ]
    try:
        for proc in peers:
            shared_swarm.local.wait_for_log(proc, "online:", timeout=180)
        yield model_dir
    finally:
        for proc in peers:
            shared_swarm.local.stop(proc)


def test_min_latency_clients_share_the_fastest_peer(swarm, parallel_peers):
    assert _routes_of_two_clients(swarm, parallel_peers, routing="min_latency") == [("fast",), ("fast",)]


def test_tradeoff_clients_spread_over_parallel_peers(swarm, parallel_peers):
    used = _routes_of_two_clients(swarm, parallel_peers, routing="tradeoff")
    assert {name for route in used for name in route} == {"fast", "slow"}, used
