"""Qwen2 (sharded checkpoint, attention biases) and Mistral (sliding window) through real peers."""

import pytest
import torch
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_greedy_equals_local(swarm, make_model, arch):
    from client import DistributedModelForCausalLM

    model_dir = make_model(arch=arch, layers=4, max_shard_size="300KB" if arch == "qwen2" else None)
    peers = [
        swarm.local.start_peer(model_dir, layers, f"{arch}-{i}", "--announce-period", "1", wait=False)
        for i, layers in enumerate(("0:2", "1:4"))
    ]
    try:
        for proc in peers:
            swarm.local.wait_for_log(proc, "online:", timeout=180)
        model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.initial_peers)
        try:
            input_ids = torch.randint(3, 400, (2, 6), generator=torch.Generator().manual_seed(5))
            expected = AutoModelForCausalLM.from_pretrained(model_dir).generate(
                input_ids, max_new_tokens=12, do_sample=False
            )
            assert torch.equal(model.generate(input_ids, max_new_tokens=12, do_sample=False), expected)
            assert f"{arch}-0" in model.last_route and f"{arch}-1" in model.last_route
        finally:
            model.shutdown()
    finally:
        for proc in peers:
            swarm.local.stop(proc)
