"""The deadline-aware bound (slo_bound.py): hand-checked, below the plain bound, never below a plan."""

from __future__ import annotations

import random

import pytest

from hexswarm.routing.scheduler.bounds.capacity import plan_capacity
from hexswarm.routing.scheduler.bounds.slo_bound import slo_upper_bound
from hexswarm.routing.scheduler.bounds.upper_bound import throughput_upper_bound
from hexswarm.routing.scheduler.cluster import Device, Link, Network, build_cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload, preset
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP
from tests.unit.test_scheduler_bound import _random_cluster

SMALL = preset("Llama-2-7B")
TOY = ModelSpec("toy", num_layers=4, hidden_size=8192)  # layers large enough for TP to pay
GB = 1e9
WORKLOAD = Workload(s_in=100, s_out=20, s_in_spread=0.0)


def _device(i: int, machine: str = "m") -> Device:
    return Device(f"d{i}", "custom", machine, "r", 1e12, 1000 * GB, 100e12)


def _one_request_alone(tp: int, link: Link) -> float:
    """Eq. 4 + 5 latency of a request on one TP group holding the toy model (batch 1, no hops)."""
    flop, scan = 2 * TOY.params_per_layer / 100e12, TOY.layer_bytes / (1000 * GB)
    hb = TOY.hidden_size * TOY.dtype_bytes
    comm = 4 * (tp - 1) * (link.latency_s + hb / (tp * link.bandwidth)) if tp > 1 else 0.0
    prefill_comm = 4 * (tp - 1) * (link.latency_s + 100 * hb / (tp * link.bandwidth)) if tp > 1 else 0.0
    decode = 20 * ((scan + flop) / tp + comm)
    prefill = 100 * flop / tp + prefill_comm
    return TOY.num_layers * (decode + prefill)


def test_one_device_is_a_threshold_at_its_own_latency():
    cluster = build_cluster([_device(0)], Network())
    plain = throughput_upper_bound(cluster, TOY, WORKLOAD, max_batch=8).tok_s
    alone = _one_request_alone(1, Link(0, 1))
    assert slo_upper_bound(cluster, TOY, WORKLOAD, alone * 1.001, max_batch=8).tok_s == pytest.approx(
        plain, rel=1e-6
    )
    assert slo_upper_bound(cluster, TOY, WORKLOAD, alone * 0.999, max_batch=8).tok_s == 0.0


def test_a_deadline_only_tp_meets_costs_its_all_reduce():
    link = Link(1e-5, 16e9)
    cluster = build_cluster([_device(0), _device(1)], Network(same_machine=link))
    plain = throughput_upper_bound(cluster, TOY, WORKLOAD, max_batch=8).tok_s
    tp1, tp2 = _one_request_alone(1, link), _one_request_alone(2, link)
    assert tp2 < tp1
    between = slo_upper_bound(cluster, TOY, WORKLOAD, (tp1 + tp2) / 2, max_batch=8).tok_s
    assert 0 < between < plain  # part of the work must run at TP 2, which pays its all-reduce
    assert slo_upper_bound(cluster, TOY, WORKLOAD, tp2 * 0.999, max_batch=8).tok_s == 0.0
    assert slo_upper_bound(cluster, TOY, WORKLOAD, 1e9, max_batch=8).tok_s == pytest.approx(plain, rel=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_never_above_the_plain_bound_and_grows_with_the_deadline(seed):
    cluster = _random_cluster(random.Random(seed))
    workload = Workload(s_out=32)
    plain = throughput_upper_bound(cluster, SMALL, workload).tok_s
    bounds = [slo_upper_bound(cluster, SMALL, workload, d).tok_s for d in (0.5, 1.0, 2.0, 8.0, 1e6)]
    assert all(a <= b * (1 + 1e-7) for a, b in zip(bounds, bounds[1:], strict=False))
    assert bounds[-1] == pytest.approx(plain, rel=1e-6)


@pytest.mark.parametrize("slo_scale", [1.5, 3.0])
@pytest.mark.parametrize("seed", range(3))
def test_never_below_a_plans_tokens_within_the_slo(seed, slo_scale):
    rng = random.Random(seed)
    cluster = _random_cluster(rng)
    workload = Workload(rate=1.0, s_out=32, num_requests=100, seed=seed, slo_scale=slo_scale)
    dp = PipelineDP(cluster, SMALL, workload)
    order = list(range(len(cluster)))
    rng.shuffle(order)
    half = max(1, len(order) // 2)
    layouts = [lay for lay in (dp.layout(order[:half]), dp.layout(order[half:])) if lay is not None]
    if not layouts:
        pytest.skip("no replica fits this cluster")
    measured = plan_capacity(cluster, layouts, SMALL, workload, seconds=3.0)
    assert measured.slo_capacity_tok_s <= measured.slo_upper_bound_tok_s * (1 + 1e-9)
    assert measured.slo_upper_bound_tok_s <= throughput_upper_bound(cluster, SMALL, workload).tok_s * (
        1 + 1e-9
    )


def test_no_deadline_is_the_plain_bound():
    cluster = _random_cluster(random.Random(3))
    plain = throughput_upper_bound(cluster, SMALL, WORKLOAD, 8, 90.0, 80.0).tok_s
    assert slo_upper_bound(cluster, SMALL, WORKLOAD, float("inf"), 8, 90.0, 80.0).tok_s == pytest.approx(
        plain
    )
