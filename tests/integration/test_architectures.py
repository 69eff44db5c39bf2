"""Every supported family through a real 2-peer chain equals the local model, token for token.

One small swarm per family: peers serve [0:2) and [1:4) of a 4-layer random checkpoint, so the
chain crosses a peer boundary inside the model and layer 1 is served by both (the client picks).
Beyond greedy tokens, the logits are compared too: Gemma's final soft-capping and embedding
scale do not change a greedy argmax, but they do change logits.
"""

import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from hexswarm.swarm.models.architectures import SUPPORTED_FAMILIES
from hexswarm.swarm.tools.launcher import LocalSwarm

pytestmark = pytest.mark.integration

# arch -> what it adds over Llama (see swarm/models/architectures.py)
FAMILIES = {
    "qwen2": "sharded checkpoint, attention biases",
    "mistral": "one sliding window for all layers",
    "qwen3": "q/k norms",
    "gemma2": "embedding scale, alternating sliding windows, attention and final soft-capping (eager)",
    "gemma3": "two rotary bases (local/global), q/k norms, final soft-capping",
    "phi3": "fused qkv and gate_up projections",
    "mixtral": "mixture of experts, per-expert checkpoint tensors fused on load",
    "qwen3_moe": "mixture of experts with a dense layer (mlp_only_layers renumbered per peer)",
}


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    """A bootstrap alone: each family brings its own two peers (the shared llama swarm is not needed)."""
    with LocalSwarm(tmp_path_factory.mktemp("families")) as local:
        local.start_bootstrap()
        yield local


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(FAMILIES))
def test_greedy_equals_local(bootstrap, make_model, arch):
    from hexswarm.client import DistributedModelForCausalLM

    model_dir = make_model(arch=arch, layers=4, max_shard_size="300KB" if arch == "qwen2" else None)
    peers = [
        bootstrap.start_peer(model_dir, layers, f"{arch}-{i}", "--announce-period", "1", wait=False)
        for i, layers in enumerate(("0:2", "1:4"))
    ]
    try:
        for proc in peers:
            bootstrap.wait_for_log(proc, "online:", timeout=180)
        model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=bootstrap.initial_peers)
        try:
            local = AutoModelForCausalLM.from_pretrained(model_dir)
            # 6 prompt + 12 new tokens: longer than the tiny Gemmas' 5-token sliding window
            input_ids = torch.randint(3, 400, (2, 6), generator=torch.Generator().manual_seed(5))
            expected = local.generate(input_ids, max_new_tokens=12, do_sample=False)
            assert torch.equal(model.generate(input_ids, max_new_tokens=12, do_sample=False), expected)
            assert f"{arch}-0" in model.last_route and f"{arch}-1" in model.last_route
            assert f"INFO peer {arch}-1 {model.spec.model_id}[1:4): online:" in peers[1].log()
            with torch.no_grad():
                torch.testing.assert_close(
                    model(expected).logits, local(expected).logits, atol=1e-4, rtol=1e-4
                )
        finally:
            model.shutdown()
    finally:
        for proc in peers:
            bootstrap.stop(proc)


def test_every_supported_family_is_tested():
    tested = {"gemma3_text" if arch == "gemma3" else arch for arch in FAMILIES} | {"llama"}  # llama: conftest
    assert tested == set(SUPPORTED_FAMILIES)


def test_unsupported_architecture_fails_at_start_with_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hexswarm.peer.cli",
            str(tmp_path),
            "--layers",
            "0:1",
            "--initial-peers",
            "/ip4/127.0.0.1/tcp/1/p2p/QmUMM67xgzV8V4puwGSHTmS7U3VxVutYhVZPYoexxBz82Q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "'gpt2' (GPT2LMHeadModel) is not supported" in lines[0]
    assert all(name in lines[0] for name in SUPPORTED_FAMILIES.values())


@pytest.mark.slow
def test_gemma3_tensor_parallel_equals_local(bootstrap, make_model):
    """A newer family through `--tp 2` (its q/k norms replicated, heads split): one TP-2 peer
    serves the whole model."""
    from hexswarm.client import DistributedModelForCausalLM

    model_dir = make_model(arch="gemma3", layers=4)
    peer = bootstrap.start_peer(
        model_dir, "0:4", "gemma3-tp", "--tp", "2", "--announce-period", "1", wait=False
    )
    try:
        bootstrap.wait_for_log(peer, "online:", timeout=240)
        model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=bootstrap.initial_peers)
        try:
            local = AutoModelForCausalLM.from_pretrained(model_dir)
            input_ids = torch.randint(3, 400, (1, 6), generator=torch.Generator().manual_seed(7))
            expected = local.generate(input_ids, max_new_tokens=10, do_sample=False)
            assert torch.equal(model.generate(input_ids, max_new_tokens=10, do_sample=False), expected)
            assert "gemma3-tp" in model.last_route
        finally:
            model.shutdown()
    finally:
        bootstrap.stop(peer)
