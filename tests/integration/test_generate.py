"""Distributed generation equals the local model's, token for token; peers come and go."""

import json
import subprocess
import sys
import time

import pytest
import torch

from hexswarm.swarm.trust.records import read_peer_records
from tests.integration.conftest import PEERS

pytestmark = pytest.mark.integration


def test_greedy_equals_local(model, local_model):
    input_ids = torch.randint(3, 400, (1, 7), generator=torch.Generator().manual_seed(1))
    expected = local_model.generate(input_ids, max_new_tokens=20, do_sample=False)
    got = model.generate(input_ids, max_new_tokens=20, do_sample=False)
    assert torch.equal(got, expected), model.last_route


def test_greedy_batch_equals_local(model, local_model):
    input_ids = torch.randint(3, 400, (3, 5), generator=torch.Generator().manual_seed(2))
    expected = local_model.generate(input_ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(model.generate(input_ids, max_new_tokens=12, do_sample=False), expected)


def test_seeded_sampling_equals_local(model, local_model):
    input_ids = torch.randint(3, 400, (2, 4), generator=torch.Generator().manual_seed(3))
    kwargs = dict(max_new_tokens=12, do_sample=True, temperature=0.9, top_k=40)
    torch.manual_seed(11)
    expected = local_model.generate(input_ids, **kwargs)
    torch.manual_seed(11)
    assert torch.equal(model.generate(input_ids, **kwargs), expected)


def test_status_lists_peers_and_full_coverage(swarm):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hexswarm.swarm.commands.cli",
            "status",
            "--initial-peers",
            *swarm.initial_peers,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("p1", "p2", "p3", "guard"):
        assert name in result.stdout
    assert "coverage: 2 2 3 2 2 2" in result.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "hexswarm.swarm.commands.cli", "status", "--initial-peers", *swarm.initial_peers, "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    (model,) = [
        m for m in json.loads(as_json.stdout)["models"] if m["num_blocks"] == 6 and len(m["peers"]) >= 4
    ]
    assert model["missing"] == [] and {p["layers"] for p in model["peers"]} >= {"0:3", "2:6", "3:6"}
    assert {
        "coverage",
        "estimated_tokens_per_s",
        "open_sessions",
        "plan",
    } <= model.keys()  # the monitor's shape


def test_a_client_of_another_checkpoint_is_told_both_model_ids(swarm, model, make_model):
    from hexswarm.client import DistributedModelForCausalLM, MissingBlocksError, ModelMismatchError

    unserved = make_model(arch="llama", seed=7)  # same shape, other weights: another model id
    other = DistributedModelForCausalLM.from_pretrained(
        unserved, initial_peers=swarm.initial_peers, coverage_timeout=2
    )
    try:
        with pytest.raises(ModelMismatchError) as caught:
            other.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2)
        assert model.spec.model_id in str(caught.value) and other.spec.model_id in str(caught.value)
        assert isinstance(caught.value, MissingBlocksError)  # callers that catch the old error still do
    finally:
        other.shutdown()


def test_stopped_peer_disappears_and_a_new_chain_is_used(swarm, model, local_model):
    """Stops whichever of p2/p3 the chain uses, then starts it again for the other tests."""
    input_ids = torch.randint(3, 400, (1, 6), generator=torch.Generator().manual_seed(4))
    expected = local_model.generate(input_ids, max_new_tokens=10, do_sample=False)
    model.generate(input_ids, max_new_tokens=10, do_sample=False)
    victim = "p2" if "p2[" in model.last_route else "p3"
    survivor = "p3" if victim == "p2" else "p2"

    assert swarm.local.stop(swarm.peers[victim], timeout=30) == 0  # a clean leave
    deadline = time.monotonic() + 20
    while any(r.name == victim for r in read_peer_records(model.swarm.dht, model.spec.model_id)):
        assert time.monotonic() < deadline, f"{victim}'s record did not disappear"
        time.sleep(0.5)

    try:
        got = model.generate(input_ids, max_new_tokens=10, do_sample=False)
        assert torch.equal(got, expected)
        assert victim not in model.last_route and survivor in model.last_route
    finally:
        layers, extra = PEERS[victim]
        swarm.peers[victim] = swarm.local.start_peer(
            swarm.model_dir, layers, victim, "--announce-period", "1", *extra
        )


def test_a_client_dials_out_and_listens_nowhere_by_default(model):
    """No open port and no NAT port mapping just to read the swarm (hivemind's client mode, no listen
    addresses); `host_maddrs=[...]` listens where asked."""
    from hexswarm.client.worker import run_sync

    with pytest.raises(ValueError, match="No multiaddrs found"):  # hivemind's word for "none"
        run_sync(model.swarm.p2p.get_visible_maddrs(latest=True), timeout=10)
