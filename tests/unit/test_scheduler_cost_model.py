"""HexGen Table 1 / Appendix B cost model against values computed by hand from the paper's formulas."""

from __future__ import annotations

import numpy as np
import pytest

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import (
    StageSpec,
    comp_cost,
    max_layers,
    pipeline_cost,
    pp_comm_cost,
    stage_memory,
    tp_comm_cost,
)
from hexswarm.routing.scheduler.model_spec import ModelSpec, preset

H, B, L = 1024, 2, 4
MEM_GIB, BW_GBPS, TFLOPS = 10.0, 100.0, 10.0
ALPHA_INTRA, BETA_INTRA = 1e-5, 128e9 / 8  # same machine: 0.01 ms, 128 Gbps
ALPHA_X, BETA_X = 2e-3, 5e9 / 8  # same region: 2 ms, 5 Gbps
S_IN, S_OUT, BATCH, LAYERS = 100, 10, 1, 2


def toy_model() -> ModelSpec:
    return ModelSpec("toy", L, H, B)  # layer_params = 0 -> the paper's 12 H^2


def toy_cluster() -> Cluster:
    dev = {
        "type": "toy",
        "memory_gb": MEM_GIB,
        "memory_bandwidth_gbps": BW_GBPS,
        "tflops": TFLOPS,
        "region": "r",
    }
    return Cluster.from_dict(
        {
            "devices": [
                dict(dev, id="a", machine="m1"),
                dict(dev, id="b", machine="m1"),
                dict(dev, id="c", machine="m2"),
            ],
            "network": {
                "same_machine": {"latency_ms": 0.01, "bandwidth_gbps": 128},
                "same_region": {"latency_ms": 2, "bandwidth_gbps": 5},
            },
        }
    )


def test_model_defaults_are_the_papers_terms():
    model = toy_model()
    assert model.params_per_layer == 12 * H**2
    assert model.kv_width == H


def test_llama_70b_preset_counts_its_real_parameters():
    model = preset("llama-2-70b")
    # q, o: H x H; k, v: H x 1024 (8 KV heads of 128); gate, up, down: H x 28672
    assert model.params_per_layer == 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    assert model.kv_width == 1024
    assert 125 < model.weight_bytes / 2**30 < 130


def test_computation_cost_eq4():
    cost = comp_cost(toy_cluster(), (0, 1), toy_model(), LAYERS, S_IN, S_OUT, BATCH)
    n, m, c = 2, BW_GBPS * 1e9, TFLOPS * 1e12
    scan = 12 * H**2 * B * S_OUT / (n * m) * LAYERS
    assert cost.prefill == pytest.approx(24 * BATCH * S_IN * H**2 / (n * c) * LAYERS)
    assert cost.decode == pytest.approx(scan + 24 * BATCH * S_OUT * H**2 / (n * c) * LAYERS)
    assert cost.total == pytest.approx(24 * BATCH * (S_IN + S_OUT) * H**2 / (n * c) * LAYERS + scan)


def test_tp_communication_cost_eq5():
    cost = tp_comm_cost(toy_cluster(), (0, 1), toy_model(), LAYERS, S_IN, S_OUT, BATCH)
    n = 2
    prefill = (ALPHA_INTRA + BATCH * S_IN * H * B / (n * BETA_INTRA)) * 4 * LAYERS
    decode = (ALPHA_INTRA + BATCH * H * B / (n * BETA_INTRA)) * 4 * S_OUT * LAYERS
    assert cost.prefill == pytest.approx(prefill)
    assert cost.decode == pytest.approx(decode)


def test_tp_cost_is_the_max_over_devices_under_bsp():
    cost = tp_comm_cost(toy_cluster(), (0, 1, 2), toy_model(), 1, S_IN, S_OUT, BATCH)
    n = 3
    # device c talks to a and b over the slow link: it is the slowest processor of the superstep
    slowest = 2 * (ALPHA_X + BATCH * S_IN * H * B / (n * BETA_X))
    assert cost.prefill == pytest.approx(slowest * 4)


def test_single_device_has_no_tp_cost():
    cost = tp_comm_cost(toy_cluster(), (2,), toy_model(), LAYERS, S_IN, S_OUT, BATCH)
    assert cost.total == 0


def test_pp_communication_cost_eq6_uses_fastest_link():
    cost = pp_comm_cost(toy_cluster(), (0, 1), (2,), toy_model(), S_IN, S_OUT, BATCH)
    assert cost.prefill == pytest.approx(ALPHA_X + BATCH * S_IN * H * B / BETA_X)
    assert cost.decode == pytest.approx((ALPHA_X + BATCH * H * B / BETA_X) * S_OUT)
    fast = pp_comm_cost(toy_cluster(), (0, 2), (1,), toy_model(), S_IN, S_OUT, BATCH)
    assert fast.prefill == pytest.approx(ALPHA_INTRA + BATCH * S_IN * H * B / BETA_INTRA)


def test_memory_eq7_and_layer_cap():
    tokens = S_IN + S_OUT
    need = stage_memory(toy_model(), 2, LAYERS, tokens, BATCH)
    expected = (12 * H**2 * B / 2 + 2 * BATCH * tokens * H * B / 2) * LAYERS + 4 * BATCH * tokens * H * B
    assert need == pytest.approx(expected)
    cap = max_layers(toy_model(), 2, MEM_GIB * 2**30, tokens, BATCH)
    assert stage_memory(toy_model(), 2, cap, tokens, BATCH) <= MEM_GIB * 2**30
    assert stage_memory(toy_model(), 2, cap + 1, tokens, BATCH) > MEM_GIB * 2**30


def test_pipeline_cost_eq2_is_the_sum_of_terms():
    cluster, model = toy_cluster(), toy_model()
    stages = [StageSpec((0, 1), 3), StageSpec((2,), 1)]
    total = pipeline_cost(cluster, stages, model, S_IN, S_OUT, BATCH)
    parts = (
        comp_cost(cluster, (0, 1), model, 3, S_IN, S_OUT)
        + tp_comm_cost(cluster, (0, 1), model, 3, S_IN, S_OUT)
        + pp_comm_cost(cluster, (0, 1), (2,), model, S_IN, S_OUT)
        + comp_cost(cluster, (2,), model, 1, S_IN, S_OUT)
    )
    assert total.prefill == pytest.approx(parts.prefill)
    assert total.decode == pytest.approx(parts.decode)


def test_costs_accept_arrays_of_prompt_lengths():
    cluster, model = toy_cluster(), toy_model()
    stages = [StageSpec((0, 1), 3), StageSpec((2,), 1)]
    lengths = np.array([50.0, 100.0, 200.0])
    batch = pipeline_cost(cluster, stages, model, lengths, S_OUT).total
    one = [pipeline_cost(cluster, stages, model, float(s), S_OUT).total for s in lengths]
    assert np.allclose(batch, one)
