"""The throughput upper bound: hand-checked, monotone, and never below a simulated plan."""

from __future__ import annotations

import math
import random

import pytest

from hexswarm.routing.scenarios.synthetic_cluster import synthetic_cluster
from hexswarm.routing.scheduler.bounds.upper_bound import throughput_upper_bound
from hexswarm.routing.scheduler.cluster import Cluster, Device, Network, build_cluster
from hexswarm.routing.scheduler.gpu_catalog import lookup
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload, preset
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP
from hexswarm.routing.scheduler.plan_eval import plan_layouts
from hexswarm.routing.scheduler.search.genetic import SearchConfig
from hexswarm.routing.scheduler.search.search import search
from hexswarm.routing.scheduler.simulation.serving import evaluate_layouts
from hexswarm.routing.scheduler.simulation.simulator import make_trace

SMALL = preset("Llama-2-7B")  # 12.6 GiB of layers: one to a few GPUs hold a replica
GPU_TYPES = ("RTX3090", "A4000", "T4", "A10", "L4", "A6000", "V100", "A100-40G")
GB = 1e9


def _device(i: int, memory: float, bandwidth: float, flops: float, machine: str = "") -> Device:
    return Device(f"d{i}", "custom", machine or f"m{i}", "r", memory, bandwidth, flops)


def _random_cluster(rng: random.Random) -> Cluster:
    devices = []
    for m in range(rng.randint(1, 4)):
        spec = lookup(rng.choice(GPU_TYPES))
        region = f"r{rng.randint(0, 1)}"
        devices += [Device.from_spec(f"m{m}-g{i}", spec, f"m{m}", region) for i in range(rng.randint(1, 4))]
    return build_cluster(devices, Network())


def _simulated_tok_s(cluster: Cluster, layouts, model: ModelSpec, workload: Workload) -> float:
    """The serving simulator's tokens/s: completed output tokens over [0, last completion]."""
    trace = make_trace(model, workload)
    return evaluate_layouts(cluster, layouts, model, trace, workload).throughput_tok_s


def test_single_device_by_hand():
    # Per layer: P params, 2P bytes; one token's K and V: 2 * kv_width * 2 bytes.
    model = ModelSpec("toy", num_layers=4, hidden_size=1024)
    p, layer_bytes = model.params_per_layer, model.layer_bytes
    flops, bandwidth = 100e12, 1000 * GB
    workload = Workload(s_in=100, s_out=20, s_in_spread=0.0)
    device = _device(0, memory=1e12, bandwidth=bandwidth, flops=flops)  # memory never binds
    cluster = build_cluster([device], Network())
    bound = throughput_upper_bound(cluster, model, workload, max_batch=8)
    # One request: prefill 100 tokens of FLOPs, then 20 decode tokens each 1/8 of a scan + FLOPs.
    per_layer = 100 * 2 * p / flops + 20 * (layer_bytes / bandwidth / 8 + 2 * p / flops)
    assert bound.tok_s == pytest.approx(20 / (model.num_layers * per_layer), rel=1e-6)
    assert bound.mean_batch == pytest.approx(8) and not bound.memory_binds


def _hand_tok_s(model: ModelSpec, batch: int, bandwidth: float = 1000 * GB, flops: float = 100e12) -> float:
    """One device, prompt 100, 20 output tokens: 20 tokens per (prefill + 20 decode steps of `batch`)."""
    p = model.params_per_layer
    per_layer = 100 * 2 * p / flops + 20 * (model.layer_bytes / bandwidth / batch + 2 * p / flops)
    return 20 / (model.num_layers * per_layer)


def test_single_device_whose_memory_admits_three_sequences():
    model = ModelSpec("toy", num_layers=4, hidden_size=1024)
    workload = Workload(s_in=100, s_out=20, s_in_spread=0.0)
    kv = 2 * model.kv_width * model.dtype_bytes * 120  # one sequence (120 tokens), one layer
    memory = model.num_layers * (model.layer_bytes + 3 * kv)  # weights + exactly 3 sequences
    cluster = build_cluster([_device(0, memory, 1000 * GB, 100e12)], Network())
    capped = throughput_upper_bound(cluster, model, workload, max_batch=3)
    assert capped.tok_s == pytest.approx(_hand_tok_s(model, 3), rel=1e-6)
    # With room to batch 8, the LP may split the device between batch levels (relaxation 7),
    # so the bound lies between batching 3 and batching 8, and memory is what binds.
    loose = throughput_upper_bound(cluster, model, workload, max_batch=8)
    assert _hand_tok_s(model, 3) <= loose.tok_s < _hand_tok_s(model, 8) and loose.memory_binds


def test_no_replica_fits_gives_zero():
    device = _device(0, memory=SMALL.weight_bytes / 2, bandwidth=1000 * GB, flops=100e12)
    bound = throughput_upper_bound(build_cluster([device], Network()), SMALL, Workload())
    assert bound.tok_s == 0.0 and "memory" in bound.binding


def test_bound_grows_with_devices_and_batch():
    rng = random.Random(5)
    cluster = _random_cluster(rng)
    extra = [Device.from_spec(f"x{i}", lookup("RTX4090"), "x", "r0") for i in range(2)]
    grown = build_cluster(list(cluster.devices) + extra, Network())
    workload = Workload()
    small = throughput_upper_bound(cluster, SMALL, workload).tok_s
    assert throughput_upper_bound(grown, SMALL, workload).tok_s > small
    assert throughput_upper_bound(cluster, SMALL, workload, max_batch=32).tok_s > small
    assert throughput_upper_bound(cluster, SMALL, workload, max_batch=1).tok_s < small


def test_identical_single_gpu_replicas_saturate_close_to_the_batch_one_bound():
    # Each GPU holds the whole model: no communication, so sequential serving at a high rate is
    # what the bound assumes at max_batch=1, less the drain at the end of the trace.
    devices = [Device.from_spec(f"g{i}", lookup("A6000"), f"m{i}", "r") for i in range(3)]
    cluster = build_cluster(devices, Network())
    workload = Workload(
        rate=50.0, s_in=128, s_out=32, s_in_spread=0.0, num_requests=600, serving="sequential", slo_scale=50
    )
    bound = throughput_upper_bound(cluster, SMALL, workload, max_batch=1)
    layouts = [PipelineDP(cluster, SMALL, workload).layout([i]) for i in range(3)]
    simulated = _simulated_tok_s(cluster, layouts, SMALL, workload)
    assert 0.8 * bound.tok_s < simulated <= bound.tok_s


@pytest.mark.parametrize(
    "serving, max_batch", [("pipelined-batched", 16), ("pipelined-batched", 1), ("sequential", 1)]
)
@pytest.mark.parametrize("seed", range(4))
def test_bound_is_never_below_random_plans_on_random_clusters(seed, serving, max_batch):
    rng = random.Random(seed)
    cluster = _random_cluster(rng)
    workload = Workload(
        rate=200.0, s_out=32, num_requests=300, seed=seed, serving=serving, max_batch=max_batch
    )
    bound = throughput_upper_bound(cluster, SMALL, workload, max_batch=max_batch)
    dp = PipelineDP(cluster, SMALL, workload)
    for _ in range(3):
        order = list(range(len(cluster)))
        rng.shuffle(order)
        cuts = sorted(rng.sample(range(1, len(order)), min(len(order) - 1, rng.randint(0, 3))))
        groups = [order[a:b] for a, b in zip([0, *cuts], [*cuts, len(order)], strict=True)]
        layouts = [lay for lay in (dp.layout(g) for g in groups) if lay is not None]
        result = evaluate_layouts(cluster, layouts, SMALL, make_trace(SMALL, workload), workload)
        assert result.throughput_tok_s <= bound.tok_s
        # the tighter bound for the prompts this simulation served (relaxation 6) holds too
        if result.served:
            prompt = result.served_prompt_tokens
            tight = throughput_upper_bound(cluster, SMALL, workload, max_batch, prompt_tokens=prompt)
            assert result.throughput_tok_s <= tight.tok_s


def test_bound_is_never_below_the_searched_plan():
    cluster = _random_cluster(random.Random(11))
    workload = Workload(rate=200.0, s_out=32, num_requests=300)
    found = search(cluster, SMALL, workload, SearchConfig(max_generations=5, time_budget_s=math.inf, seed=1))
    layouts = plan_layouts(cluster, SMALL, workload, found.plan)
    simulated = _simulated_tok_s(cluster, layouts, SMALL, workload)
    estimate = found.plan.estimate
    assert 0 < simulated <= throughput_upper_bound(cluster, SMALL, workload).tok_s
    assert estimate.upper_bound_tok_s > 0 and 0 < estimate.bound_ratio <= 1


def test_thousand_gpus_have_a_bound():  # speed is measured in benchmarks/bound.py
    bound = throughput_upper_bound(synthetic_cluster(), preset("Llama-2-70B"), Workload())
    assert bound.tok_s > 0 and bound.requests_s == pytest.approx(bound.tok_s / 32)


def test_longer_prompts_lower_the_bound():
    cluster = _random_cluster(random.Random(2))
    workload = Workload(s_in=128, s_in_spread=0.5)
    strict = throughput_upper_bound(cluster, SMALL, workload)  # shortest prompt, 64 tokens
    mean = throughput_upper_bound(cluster, SMALL, workload, prompt_tokens=128)
    assert mean.tok_s < strict.tok_s
    assert mean.prefill_share > strict.prefill_share


def test_coupling_prefill_to_decode_tightens_only_mixed_clusters():
    # A compute-rich and a bandwidth-rich device: uncoupled (rho = 0), the LP gives prefill to one
    # and decode to the other, which no pipeline can do; coupled, each device does both.
    devices = [
        _device(0, memory=1e12, bandwidth=300 * GB, flops=300e12),
        _device(1, memory=1e12, bandwidth=3000 * GB, flops=30e12),
    ]
    cluster = build_cluster(devices, Network())
    workload = Workload(s_in=128, s_out=32, s_in_spread=0.0)
    free = throughput_upper_bound(cluster, SMALL, workload, coupled_prompt_tokens=0.0).tok_s
    coupled = throughput_upper_bound(cluster, SMALL, workload).tok_s
    assert coupled < 0.95 * free
    same = build_cluster([_device(i, 1e12, 1000 * GB, 100e12) for i in range(2)], Network())
    assert throughput_upper_bound(same, SMALL, workload).tok_s == pytest.approx(
        throughput_upper_bound(same, SMALL, workload, coupled_prompt_tokens=0.0).tok_s, rel=1e-6
    )
