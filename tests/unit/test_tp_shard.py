"""Tensor-parallel splitting without processes: device lists, degrees, and each rank's slices."""

import pytest
import torch

from hexswarm.peer.devices import DeviceError, parse_devices, threads_per_rank
from hexswarm.peer.tp.shard import ShardPlan, TPDegreeError, check_degree, shard_config
from hexswarm.swarm.models.checkpoint import load_tensors
from hexswarm.swarm.models.model_spec import load_model_spec

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "text, tp, default, expected",
    [
        (None, 1, "cpu", (CPU,)),
        (None, 2, "cpu", (CPU, CPU)),
        ("cpu,cpu", 2, "cuda", (CPU, CPU)),
        (" cpu , cpu ", 2, "cpu", (CPU, CPU)),
    ],
)
def test_device_lists(text, tp, default, expected):
    assert parse_devices(text, tp, default) == expected


@pytest.mark.parametrize(
    "text, tp, message",
    [
        ("cpu", 2, "--tp 2 needs 2 devices, but --devices names 1"),
        ("cpu,cpu,cpu", 2, "names 3"),
        ("cpu,", 2, "a device is missing"),
        ("cuda:0,cuda:0", 2, "cuda:0 is given twice"),
        ("cuda:0,cuda:7", 2, "is missing: this machine has"),
        ("cuda,cuda", 2, "name each GPU with its index"),
        ("cpu,cuda:0", 2, "share a device type"),
        ("tpu9", 1, "not a device name"),
        (None, 0, "at least 1"),
    ],
)
def test_bad_device_lists_name_the_problem(text, tp, message):
    with pytest.raises(DeviceError, match=message):
        parse_devices(text, tp, "cpu")


def test_cpu_ranks_split_the_cores():
    assert threads_per_rank((CPU,) * 64) == 1
    assert threads_per_rank((CPU,)) >= threads_per_rank((CPU, CPU))


def test_degree_must_divide_heads_and_kv_heads(make_model):
    config = load_model_spec(make_model(arch="qwen2", heads=4, kv_heads=2)).config
    check_degree(config, 2)
    with pytest.raises(TPDegreeError, match="--tp 4 does not divide the model's 2 KV heads"):
        check_degree(config, 4)
    with pytest.raises(TPDegreeError, match="--tp 3 does not divide the model's 4 attention heads"):
        check_degree(config, 3)
    local = shard_config(config, 2)
    assert (local.num_attention_heads, local.num_key_value_heads) == (2, 1)
    assert local.head_dim == config.hidden_size // config.num_attention_heads


def test_rank_slices_cover_each_tensor_once(make_model):
    """Column-parallel tensors (q/k/v with Qwen2's biases, gate/up) split by rows, row-parallel
    weights by columns; the ranks' parts put together are the whole tensor. A row-parallel
    bias is kept by rank 0 only, so the all-reduced sum adds it once."""
    spec = load_model_spec(make_model(arch="qwen2", max_shard_size="200KB"))
    prefix = "model.layers.1."
    whole = load_tensors(spec.path, lambda n: n.startswith(prefix), torch.float32)
    plans = [ShardPlan(spec.config, rank, 2) for rank in range(2)]
    parts = [
        {n: p.finish(n, t) for n, t in load_tensors(spec.path, lambda n: n.startswith(prefix), torch.float32,
                                                     slice_of=p.slice_of).items()}
        for p in plans
    ]  # fmt: skip
    styles = {name: plans[0].style(name) for name in whole}
    assert styles[prefix + "self_attn.k_proj.bias"] == "colwise"
    assert styles[prefix + "mlp.down_proj.weight"] == "rowwise"
    assert styles[prefix + "input_layernorm.weight"] is None
    for name, tensor in whole.items():
        if styles[name] == "colwise":
            torch.testing.assert_close(torch.cat([p[name] for p in parts], dim=0), tensor, rtol=0, atol=0)
        elif styles[name] == "rowwise" and name.endswith(".weight"):
            torch.testing.assert_close(torch.cat([p[name] for p in parts], dim=1), tensor, rtol=0, atol=0)
        elif styles[name] == "rowwise":
            assert torch.equal(parts[0][name], tensor) and not parts[1][name].any()
        else:
            assert all(torch.equal(p[name], tensor) for p in parts)
