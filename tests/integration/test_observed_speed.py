"""A peer that announces itself 100x faster than it computes (client/observed.py): the client
times its decode steps, routes it by what it observed from the next generation on, and the
honest peer's announcement stands. Three clients, each with a key of its own, publish what they
observed, and `hexswarm status` flags the boaster (swarm/trust/speed_reports.py). Real run-peer
processes and real clients on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.records import read_peer_records
from tests.integration.test_status_escapes import run_status

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = torch.tensor([[5, 6, 7, 8]])
NEW_TOKENS = 12  # 11 decode steps: more than MIN_SAMPLES


def test_a_peer_slower_than_it_announces_is_routed_by_what_is_observed(make_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from hexswarm.client import DistributedModelForCausalLM

    model_dir = make_model(arch="llama", layers=2, seed=52)
    expected = AutoModelForCausalLM.from_pretrained(model_dir).generate(
        PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False
    )
    with LocalSwarm(tmp_path) as local:
        local.start_bootstrap()
        # The announced gap (2 blocks x 20 ms) is wider than a loaded machine's ping jitter, so
        # the first route follows the announcements; 100 ms a step is wider still, so the second
        # does not.
        local.start_peer(model_dir, "0:2", "steady", "--throughput", "200", "--decode-ms", "20", wait=False)
        local.start_peer(
            model_dir, "0:2", "boaster", "--throughput", "20000", "--decode-ms", "0.05",
            "--debug-slow-ms", "100", wait=False,
        )  # fmt: skip
        for proc in local.processes[1:]:
            local.wait_for_log(proc, "online:", timeout=120)
        model = DistributedModelForCausalLM.from_pretrained(
            model_dir, initial_peers=local.initial_peers, routing="min_latency"
        )
        try:
            names = _wait_for_both(model)
            routes = []
            for _ in range(3):
                out = model.generate(PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False)
                assert torch.equal(out, expected)
                routes.append(model.last_route)
            assert routes[0].startswith("boaster"), routes  # believed at first: nothing observed yet
            assert all(route.startswith("steady") for route in routes[1:]), routes
            assert {names[p] for p in model.swarm.observed.flagged} == {"boaster"}
            boaster = next(p for p, n in names.items() if n == "boaster")
            assert model.swarm.observed.ms_per_block(boaster) >= 30  # 100 ms a step over 2 blocks, less ping
        finally:
            model.shutdown()  # it publishes what it observed (swarm/trust/speed_reports.py)
        _two_more_clients_observe_it(model_dir, local.initial_peers)
        status = run_status(local.initial_peers)
        text = status.stdout.decode()
        assert "OVER-ANNOUNCES: boaster" in text and "3 clients observe" in text, text
        assert "OVER-ANNOUNCES: steady" not in text
        as_json = json.loads(run_status(local.initial_peers, "--json").stdout)
        peers = {p["name"]: p for p in as_json["models"][0]["peers"]}
        assert peers["boaster"]["over_announced"] and peers["boaster"]["observed_reporters"] == 3
        assert not peers["steady"]["over_announced"]


def _wait_for_both(model, timeout: float = 30.0) -> dict[str, str]:
    """Peer id -> name once the client's DHT holds both announcements: the first generation
    must choose between them, not take the only one stored so far."""
    deadline = time.monotonic() + timeout
    while True:
        names = {r.peer_id: r.name for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
        if set(names.values()) == {"steady", "boaster"} or time.monotonic() > deadline:
            return names
        time.sleep(0.5)


CLIENT = """
import sys, torch
from hexswarm.client import DistributedModelForCausalLM
model = DistributedModelForCausalLM.from_pretrained(sys.argv[1], initial_peers=sys.argv[2:], routing="min_latency")
try:
    model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=12, do_sample=False)
    assert model.last_route.startswith("boaster"), model.last_route  # believed: it observed nothing yet
finally:
    model.shutdown()
"""


def _two_more_clients_observe_it(model_dir, initial_peers: list[str]) -> None:
    """Two client processes of keys of their own route their one generation through the
    boaster, then publish what they observed as they shut down."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(model_dir), *initial_peers], stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()[-2000:]
