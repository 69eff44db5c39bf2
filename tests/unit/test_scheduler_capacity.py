"""A plan's capacity: saturating, never above the bound, and what bound_ratio reports."""

from __future__ import annotations

import math
import random

import pytest

from hexswarm.routing.scheduler.bounds.capacity import plan_capacity
from hexswarm.routing.scheduler.cluster import Device, Network, build_cluster
from hexswarm.routing.scheduler.gpu_catalog import lookup
from hexswarm.routing.scheduler.model_spec import Workload, preset
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP
from hexswarm.routing.scheduler.plan import Plan
from hexswarm.routing.scheduler.plan_eval import plan_layouts
from hexswarm.routing.scheduler.search.genetic import SearchConfig
from hexswarm.routing.scheduler.search.search import search
from hexswarm.routing.scheduler.simulation.serving import evaluate_layouts
from hexswarm.routing.scheduler.simulation.simulator import make_trace
from tests.unit.test_scheduler_bound import _random_cluster

SMALL = preset("Llama-2-7B")


@pytest.mark.parametrize("serving", ["pipelined-batched", "sequential"])
@pytest.mark.parametrize("seed", range(3))
def test_capacity_never_exceeds_the_bound_on_random_clusters(seed, serving):
    rng = random.Random(seed)
    cluster = _random_cluster(rng)
    workload = Workload(rate=1.0, s_out=32, num_requests=100, seed=seed, serving=serving)
    dp = PipelineDP(cluster, SMALL, workload)
    order = list(range(len(cluster)))
    rng.shuffle(order)
    half = max(1, len(order) // 2)
    layouts = [lay for lay in (dp.layout(order[:half]), dp.layout(order[half:])) if lay is not None]
    measured = plan_capacity(cluster, layouts, SMALL, workload, seconds=3.0)
    if not layouts:
        assert measured.capacity_tok_s == 0.0
        return
    assert 0 < measured.slo_capacity_tok_s <= measured.upper_bound_tok_s
    assert 0 < measured.capacity_tok_s <= measured.upper_bound_tok_s


def test_capacity_is_above_the_throughput_at_a_light_rate():
    # Two A6000s, each a whole replica: at 1 request/s the throughput is what arrives; the
    # capacity is what the pipelines could serve, far more (the point of bound_ratio).
    devices = [Device.from_spec(f"g{i}", lookup("A6000"), f"m{i}", "r") for i in range(2)]
    cluster = build_cluster(devices, Network())
    workload = Workload(rate=1.0, s_out=32, num_requests=100, slo_scale=20)
    dp = PipelineDP(cluster, SMALL, workload)
    layouts = [dp.layout([0]), dp.layout([1])]
    light = evaluate_layouts(cluster, layouts, SMALL, make_trace(SMALL, workload), workload)
    measured = plan_capacity(cluster, layouts, SMALL, workload, seconds=3.0)
    assert measured.capacity_tok_s > 5 * light.throughput_tok_s
    assert measured.capacity_tok_s >= measured.slo_capacity_tok_s


def test_searched_plan_reports_capacity_and_ratio():
    cluster = _random_cluster(random.Random(11))
    workload = Workload(rate=20.0, s_out=32, num_requests=200)
    found = search(cluster, SMALL, workload, SearchConfig(max_generations=3, time_budget_s=math.inf, seed=1))
    est = found.plan.estimate
    assert 0 < est.bound_ratio <= 1 and 0 < est.slo_bound_ratio <= 1
    assert est.bound_ratio == pytest.approx(est.capacity_tok_s / est.upper_bound_tok_s)
    assert found.plan.to_dict()["estimate"]["capacity_tok_s"] == est.capacity_tok_s
    assert plan_layouts(cluster, SMALL, workload, found.plan)


def test_allreduce_share_is_zero_at_tp_1_and_grows_with_the_degree():
    from hexswarm.routing.scheduler.bounds.capacity import allreduce_share
    from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout, StageLayout

    devices = [Device.from_spec(f"g{i}", lookup("A6000"), "m", "r") for i in range(4)]
    cluster = build_cluster(devices, Network())
    workload = Workload(s_out=32)
    layers = SMALL.num_layers

    def share(*groups):
        return allreduce_share(
            cluster, [PipelineLayout((StageLayout(g, 0, layers),), 0.0, 0.0) for g in groups], SMALL, workload
        )

    assert share((0,), (1,)) == 0.0
    assert 0 < share((0, 1)) < share((0, 1, 2, 3)) < 1
    assert share((0,), (2, 3)) < share((2, 3))  # a TP-1 pipeline dilutes it by its rate


def _mixed_cluster():
    """Two A6000 and two RTX 3090 machines of 4 GPUs: Llama-2-70B at SLO scale 5 needs TP 4 there."""
    devices = [
        Device.from_spec(f"m{m}-g{i}", lookup(kind), f"m{m}", "r")
        for m, kind in enumerate(["A6000", "A6000", "RTX3090", "RTX3090"])
        for i in range(4)
    ]
    return build_cluster(devices, Network())


def test_throughput_objective_plans_for_capacity_without_a_deadline():
    cluster, model = _mixed_cluster(), preset("Llama-2-70B")
    config = SearchConfig(max_generations=40, time_budget_s=math.inf, seed=0, stall_generations=20)
    slo = search(cluster, model, Workload(rate=2.0, num_requests=200), config).plan.estimate
    most = search(cluster, model, Workload(rate=2.0, num_requests=200, objective="throughput"), config)
    est = most.plan.estimate
    assert est.objective == "throughput" and est.slo_s == float("inf")
    assert est.rate > 2.0  # the search offered a saturating rate, not --rate
    assert est.capacity_tok_s > 1.2 * slo.capacity_tok_s  # no deadline forcing wide TP groups
    assert est.bound_ratio > slo.bound_ratio and est.bound_ratio <= 1
    assert Plan.from_json(most.plan.to_json()) == most.plan  # inf travels as null


def test_throughput_objective_under_sequential_serving_ranks_by_served_rate():
    cluster, model = _mixed_cluster(), preset("Llama-2-70B")
    workload = Workload(num_requests=100, serving="sequential", objective="throughput")
    found = search(cluster, model, workload, SearchConfig(max_generations=10, time_budget_s=math.inf, seed=0))
    est = found.plan.estimate
    assert est.attainment == 1.0 and est.throughput_tok_s > 0  # nothing is late without a deadline
    assert found.history[-1] == pytest.approx(est.throughput_tok_s / workload.s_out, rel=1e-6)


def test_unknown_objective_is_refused():
    with pytest.raises(ValueError, match="objective"):
        Workload(objective="latency")
