"""peer/quant.py and quantized block stacks: what a `--quant` peer computes and stores."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.quant import (
    Int8Linear,
    QuantError,
    check_backend,
    quantize_layer,
    quantize_model,
    weight_bytes,
)
from hexswarm.swarm.models.model_spec import load_model_spec

CPU = torch.device("cpu")


def test_int8_linear_is_the_int8_weights_times_their_row_scales():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    q = Int8Linear.from_linear(linear, torch.bfloat16)
    assert q.qweight.dtype == torch.int8 and q.qweight.abs().max() <= 127
    dequantized = q.qweight.float() * q.scales.float()[:, None]
    assert (dequantized - linear.weight).abs().max() <= q.scales.float().max() / 2 + 1e-6
    x = torch.randn(2, 3, 64)
    with torch.inference_mode():
        expected = (x.bfloat16() @ dequantized.bfloat16().T).float() + linear.bias
        assert torch.allclose(q(x), expected, atol=2e-2, rtol=2e-2)
        assert q(x).dtype == torch.float32 and q(x).shape == (2, 3, 48)


@pytest.mark.parametrize("quant,most", [("int8", 0.3), ("nf4", 0.17)])
def test_quantized_linear_weights_take_the_bytes_the_issue_allows(quant, most):
    layer = nn.Sequential(nn.Linear(576, 1536, bias=False), nn.Linear(1536, 576, bias=False))
    full = weight_bytes(layer)
    quantize_layer(layer, quant, torch.float32, CPU)
    assert weight_bytes(layer) <= most * full, weight_bytes(layer) / full


def test_only_linear_layers_are_quantized():
    layer = nn.ModuleDict({"proj": nn.Linear(16, 16), "norm": nn.LayerNorm(16), "emb": nn.Embedding(4, 16)})
    quantize_layer(layer, "int8", torch.float32, CPU)
    assert isinstance(layer["proj"], Int8Linear)
    assert type(layer["norm"]) is nn.LayerNorm and type(layer["emb"]) is nn.Embedding


@pytest.mark.parametrize("quant", ["none", "int8", "nf4"])
def test_a_quantized_stack_equals_the_model_quantized_the_same_way(make_model, quant):
    """Block by block loading, then quantizing: the same numbers as quantizing a loaded model."""
    from transformers import AutoModelForCausalLM

    spec = load_model_spec(make_model(arch="llama"))
    stack = BlockStack.load(spec, 0, spec.num_blocks, torch.float32, CPU, quant=quant)
    reference = quantize_model(copy.deepcopy(AutoModelForCausalLM.from_pretrained(spec.path)), quant)
    ids = torch.randint(3, 400, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = reference(ids, output_hidden_states=True).hidden_states[-1]
        hidden = stack.forward(reference.model.embed_tokens(ids), stack.new_cache("s"), 0, 0, spec.num_blocks)
        assert torch.equal(reference.model.norm(hidden), expected)
    if quant != "none":
        full = BlockStack.load(spec, 0, 1, torch.float32, CPU).weight_bytes_per_block()
        assert stack.weight_bytes_per_block() < 0.5 * full


def test_check_backend_names_the_formats_for_an_unknown_one():
    with pytest.raises(QuantError, match="the formats are none, int8, nf4"):
        check_backend("fp8", torch.float32, CPU)
    for quant in ("none", "int8"):
        check_backend(quant, torch.float32, CPU)  # int8 runs on every CPU torch builds for


def test_run_peer_refuses_an_unknown_format_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "hexswarm.peer.cli", "m", "--layers", "0:1", "--quant", "fp8"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "invalid choice: 'fp8'" in result.stderr
    assert "none" in result.stderr and "int8" in result.stderr and "nf4" in result.stderr


def test_nf4_without_bitsandbytes_is_one_line_naming_what_to_install(monkeypatch):
    import hexswarm.peer.quant as quant

    def missing():
        raise ImportError("No module named 'bitsandbytes'")

    monkeypatch.setattr(quant, "_bitsandbytes", missing)
    with pytest.raises(QuantError, match=r"^--quant nf4 needs bitsandbytes \(pip install bitsandbytes\)$"):
        check_backend("nf4", torch.float32, CPU)


def test_the_default_cache_leaves_room_for_quantized_weights(monkeypatch, make_model):
    """Where memory binds, the default --cache-tokens grows by what the format frees."""
    import argparse

    import hexswarm.peer.devices as devices
    from hexswarm.peer.cli import default_cache_tokens
    from hexswarm.swarm.trust.records import DeviceInfo

    spec = load_model_spec(make_model(arch="llama"))
    # a GPU just big enough for the weights in float32 and a little cache
    weights = (
        BlockStack.load(spec, 0, spec.num_blocks, torch.float32, CPU).weight_bytes_per_block()
        * spec.num_blocks
    )
    gpu = DeviceInfo(type="cuda", name="small", memory_bytes=int(1.2 * weights / 0.9), cores=1)
    monkeypatch.setattr(devices, "describe", lambda device, threads: gpu)

    def tokens(quant: str, max_sessions: int = 10**6) -> int:
        args = argparse.Namespace(max_sessions=max_sessions, max_length=64, quant=quant)
        return default_cache_tokens(args, spec, spec.num_blocks, torch.float32, (torch.device("cuda"),))

    assert 64 <= tokens("none") < tokens("int8") < tokens("nf4")
    assert tokens("int8", max_sessions=2) == 2 * 64  # where memory does not bind: sessions x length
