"""Output verification (client/verify.py) on a live swarm: an honest swarm is never flagged
over 1,000 verified steps, and a peer that corrupts its outputs is caught, banned and reported."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hexswarm.client.verify import VerificationError
from hexswarm.swarm.launcher import LocalSwarm
from hexswarm.swarm.records import read_peer_records
from hexswarm.swarm.reports import read_reports

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = ("--throughput", "100", "--decode-ms", "1", "--announce-period", "1")


@pytest.fixture(scope="module")
def verify_swarm(make_model, tmp_path_factory):
    model_dir = make_model(arch="llama", layers=2, seed=33)
    with LocalSwarm(tmp_path_factory.mktemp("verify")) as local:
        local.start_bootstrap()
        for name in ("honest-a", "honest-b"):
            local.start_peer(model_dir, "0:2", name, *FAST, wait=False)
        for proc in local.processes[1:]:
            local.wait_for_log(proc, "online:", timeout=180)
        yield local, model_dir


@pytest.fixture(scope="module")
def reference(verify_swarm):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(verify_swarm[1])


def _client(local, model_dir, verify: float):
    from hexswarm.client import DistributedModelForCausalLM

    return DistributedModelForCausalLM.from_pretrained(
        model_dir, initial_peers=local.initial_peers, verify=verify
    )


def test_honest_swarm_is_never_flagged_over_1000_verified_steps(verify_swarm, reference):
    local, model_dir = verify_swarm
    model = _client(local, model_dir, verify=1.0)

    def generate(seed: int) -> None:
        input_ids = torch.randint(3, 200, (1, 4), generator=torch.Generator().manual_seed(seed))
        out = model.generate(input_ids, max_new_tokens=60, do_sample=False)
        assert torch.equal(out, reference.generate(input_ids, max_new_tokens=60, do_sample=False))

    try:
        with ThreadPoolExecutor(4) as pool:  # several sessions at once: a cheaper 1,000 steps
            list(pool.map(generate, range(20)))
        stats = model.verify_stats
        print(f"verify=1.0 over 20 sessions: {stats}")
        assert stats.verified >= 1000
        assert stats.mismatches == 0 and stats.unverifiable == 0 and not model.swarm.distrusted
    finally:
        model.shutdown()


def test_corrupting_peer_is_caught_banned_and_reported(verify_swarm, reference):
    local, model_dir = verify_swarm
    bad = local.start_peer(model_dir, "0:2", "corrupt", *FAST, "--debug-corrupt-outputs")
    model = _client(local, model_dir, verify=1.0)
    try:
        names = {r.peer_id: r.name for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
        input_ids = torch.tensor([[7, 8, 9, 10]])
        expected = reference.generate(input_ids, max_new_tokens=8, do_sample=False)
        failed = 0
        for _ in range(8):
            try:
                out = model.generate(input_ids, max_new_tokens=8, do_sample=False)
            except VerificationError as e:  # the corrupt peer was serving the step: the call fails
                assert e.peer == "corrupt"
                failed += 1
                continue
            if model.swarm.distrusted:
                assert torch.equal(out, expected)  # the witness was corrupt: the output stood
                break
        else:
            pytest.fail(f"the corrupt peer was never caught: {model.verify_stats}")
        assert {names.get(p) for p in model.swarm.distrusted} == {"corrupt"}, (model.swarm.distrusted, names)
        out = model.generate(input_ids, max_new_tokens=8, do_sample=False)  # routes around the banned peer
        assert torch.equal(out, expected)

        reports = read_reports(model.swarm.dht, model.spec.model_id)
        against = [r for r in reports if r.reported in model.swarm.distrusted]
        assert against and against[0].tie_breaker, reports  # a third peer confirmed it
        status = subprocess.run(
            [sys.executable, "-m", "hexswarm.swarm.cli", "status", "--initial-peers", *local.initial_peers],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "REPORTED" in status.stdout and "corrupt" in status.stdout, status.stdout + status.stderr
        print(f"caught after {failed} failed call(s); status says:\n{status.stdout}")
    finally:
        model.shutdown()
        local.stop(bad)
