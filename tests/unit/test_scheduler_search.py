"""Genetic search (HexGen §4.3), simulator and warm start: determinism, feasibility, re-planning."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hexswarm.routing.baselines.symmetric import SymmetricDP
from hexswarm.routing.baselines.table4 import table4_plan
from hexswarm.routing.scenarios.hexgen_clusters import scenario
from hexswarm.routing.scheduler.cluster import Device
from hexswarm.routing.scheduler.gpu_catalog import lookup
from hexswarm.routing.scheduler.model_spec import Workload, preset
from hexswarm.routing.scheduler.plan import validate
from hexswarm.routing.scheduler.plan_eval import evaluate_plan, memory_violations
from hexswarm.routing.scheduler.search.ga_operators import elbow_k, kmeans_init
from hexswarm.routing.scheduler.search.genetic import SearchConfig, warm_individual
from hexswarm.routing.scheduler.search.search import search
from hexswarm.routing.scheduler.simulation.simulator import Trace, simulate

MODEL = preset("Llama-2-70B")
WORKLOAD = Workload(rate=2.0, s_out=32, num_requests=150)
# Every search here stops after a set number of generations (or a stall), never on the clock: a
# wall-clock budget would make the plan, and so these assertions, depend on the machine's load.
QUICK = SearchConfig(max_generations=12, time_budget_s=math.inf, seed=3)


@pytest.fixture(scope="module")
def half_price():
    return scenario("heterogeneous-half-price")


@pytest.fixture(scope="module")
def half_price_result(half_price):
    return search(half_price, MODEL, WORKLOAD, QUICK)


def test_simulator_rejects_requests_that_would_miss_the_deadline():
    trace = Trace(np.array([0.0, 0.1, 5.0]), np.array([10.0, 10.0, 10.0]), 8, deadline_s=1.5)
    one = simulate(np.ones((1, 3)), trace)
    assert one.attainment == pytest.approx(2 / 3) and one.rejected == 1
    two = simulate(np.ones((2, 3)), trace)
    assert two.attainment == 1.0 and two.mean_latency_s == pytest.approx(1.0)
    none = simulate(np.empty((0, 3)), trace)
    assert none.attainment == 0.0


def test_elbow_and_kmeans_follow_regions(half_price):
    assert elbow_k([100, 20, 5, 4, 3.5, 3.2]) == 2
    elbow, partitions = kmeans_init(half_price, range(len(half_price)), seed=0)
    assert 2 <= elbow <= 5
    regions = sorted(sorted({half_price.devices[d].region for d in g}) for g in partitions[3])
    assert regions == [["iceland"], ["nevada"], ["norway"]]  # groups avoid the slow cross-region links
    for k in range(1, 6):  # and do not split a machine while there are no more groups than machines
        group_of = {d: n for n, g in enumerate(partitions[k]) for d in g}
        for machine in {d.machine for d in half_price.devices}:
            members = [i for i, d in enumerate(half_price.devices) if d.machine == machine]
            assert len({group_of[i] for i in members}) == 1


def test_search_is_deterministic_for_a_seed(half_price, half_price_result):
    again = search(half_price, MODEL, WORKLOAD, QUICK)
    assert again.plan.to_dict() == half_price_result.plan.to_dict()
    assert again.history == half_price_result.history


def test_every_plan_fits_memory(half_price, half_price_result):
    configs = [
        SearchConfig(max_generations=5, time_budget_s=math.inf, seed=1, mutation="random"),
        SearchConfig(max_generations=5, time_budget_s=math.inf, layout_dp=SymmetricDP),
    ]
    plans = [half_price_result.plan] + [search(half_price, MODEL, WORKLOAD, c).plan for c in configs]
    for plan in plans:
        validate(plan)
        assert plan.pipelines
        assert memory_violations(half_price, MODEL, WORKLOAD, plan) == []


def test_estimate_matches_replaying_the_plan(half_price, half_price_result):
    replay = evaluate_plan(half_price, MODEL, WORKLOAD, half_price_result.plan)
    assert replay.attainment == pytest.approx(half_price_result.plan.estimate.attainment)


def test_table4_plan_is_feasible_and_beaten_or_matched():
    cluster = scenario("heterogeneous-full-price")
    plan = table4_plan(cluster, MODEL)
    validate(plan)
    assert len(plan.pipelines) == 12 and len(plan.device_ids) == 58
    assert [p.strategy for p in plan.pipelines][:3] == [[4, 4], [4, 4], [2, 1, 1, 2]]
    assert memory_violations(cluster, MODEL, WORKLOAD, plan) == []
    ours = search(cluster, MODEL, WORKLOAD, SearchConfig(max_generations=8, time_budget_s=math.inf, seed=0))
    assert ours.result.attainment >= evaluate_plan(cluster, MODEL, WORKLOAD, plan).attainment


def test_progress_is_reported(half_price):
    seen = []
    search(
        half_price,
        MODEL,
        WORKLOAD,
        SearchConfig(max_generations=3, time_budget_s=math.inf),
        progress=seen.append,
    )
    assert [p.generation for p in seen] == [1, 2, 3]
    assert all(0 <= p.best_attainment <= 1 for p in seen)


def test_warm_start_after_leave(half_price, half_price_result):
    gone = set(half_price_result.plan.pipelines[0].device_ids[:4])
    smaller = half_price.without(gone)
    warm = warm_individual(smaller, half_price_result.plan)
    assert sorted(d for g in warm for d in g) == list(range(len(smaller)))
    result = search(
        smaller,
        MODEL,
        WORKLOAD,
        SearchConfig(max_generations=4, time_budget_s=math.inf, seed=3),
        previous=half_price_result.plan,
    )
    assert not gone & set(result.plan.device_ids)
    assert memory_violations(smaller, MODEL, WORKLOAD, result.plan) == []
    # the surviving pipelines alone are one candidate, so the warm search does at least as well
    survivors = [p for p in half_price_result.plan.pipelines if not gone & set(p.device_ids)]
    kept = type(half_price_result.plan)(MODEL.name, MODEL.num_layers, tuple(survivors))
    assert result.result.attainment >= evaluate_plan(smaller, MODEL, WORKLOAD, kept).attainment


def test_warm_start_after_join(half_price, half_price_result):
    a6000 = lookup("A6000")
    joined = half_price.with_devices(
        [Device.from_spec(f"new-g{i}", a6000, "new-0", "nevada") for i in range(4)]
    )
    result = search(
        joined,
        MODEL,
        WORKLOAD,
        SearchConfig(max_generations=4, time_budget_s=math.inf, seed=3),
        previous=half_price_result.plan,
    )
    assert memory_violations(joined, MODEL, WORKLOAD, result.plan) == []
    assert result.result.attainment >= half_price_result.result.attainment
    assert result.result.goodput_rps >= half_price_result.result.goodput_rps - 1e-9


def test_cluster_too_small_is_a_clear_error():
    from hexswarm.routing.scheduler.search.search_result import NoFeasiblePlanError

    cluster = scenario("heterogeneous-half-price").subset({"norway-0-g0", "norway-0-g1"})
    with pytest.raises(NoFeasiblePlanError, match="GiB"):
        search(cluster, MODEL, WORKLOAD, QUICK)
