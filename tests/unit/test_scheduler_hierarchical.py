"""Region-by-region search for large clusters (routing.scheduler.search.hierarchical)."""

from __future__ import annotations

import math

import pytest

from hexswarm.routing.scenarios.synthetic_cluster import synthetic_cluster
from hexswarm.routing.scheduler.model_spec import Workload, preset
from hexswarm.routing.scheduler.plan import validate
from hexswarm.routing.scheduler.plan_eval import memory_violations
from hexswarm.routing.scheduler.search.genetic import SearchConfig
from hexswarm.routing.scheduler.search.hierarchical import FLAT_LIMIT, region_groups
from hexswarm.routing.scheduler.search.search import search

# Every search here stops after a set number of generations (or a stall), never on the clock: a
# wall-clock budget would make the plan, and so these assertions, depend on the machine's load.
MODEL = preset("Llama-2-7B")
WORKLOAD = Workload(rate=50.0, s_out=16, num_requests=300)


@pytest.fixture(scope="module")
def cluster():
    return synthetic_cluster(FLAT_LIMIT + 40, 8, seed=1)


@pytest.fixture(scope="module")
def found(cluster):
    return search(
        cluster,
        MODEL,
        WORKLOAD,
        SearchConfig(max_generations=40, time_budget_s=math.inf, stall_generations=5),
    )


def test_region_groups_cover_the_cluster_and_each_holds_a_replica(cluster):
    groups = region_groups(cluster, preset("Llama-2-70B"))
    assert sorted(i for g in groups for i in g) == list(range(len(cluster)))
    regions = [{cluster.devices[i].region for i in g} for g in groups]
    assert all(len(r) >= 1 for r in regions) and len(groups) <= 8
    if len(groups) > 1:  # merged groups exist only to reach one replica's memory
        need = preset("Llama-2-70B").weight_bytes
        assert all(sum(cluster.devices[i].memory_bytes for i in g) >= need for g in groups)


def test_large_cluster_plan_is_valid_and_keeps_pipelines_inside_region_groups(cluster, found):
    plan = found.plan
    validate(plan)
    assert memory_violations(cluster, MODEL, WORKLOAD, plan) == []
    group_of = {}
    for n, g in enumerate(region_groups(cluster, MODEL)):
        for i in g:
            group_of[cluster.devices[i].id] = n
    for pipeline in plan.pipelines:
        assert len({group_of[d] for d in pipeline.device_ids}) == 1
    assert plan.estimate.upper_bound_tok_s > 0 and 0 < plan.estimate.bound_ratio <= 1


def test_replan_after_a_leave_repairs_without_the_departed(cluster, found):
    gone = set(sorted(found.plan.device_ids)[:: max(1, len(found.plan.device_ids) // 8)])
    smaller = cluster.without(gone)
    again = search(
        smaller,
        MODEL,
        WORKLOAD,
        SearchConfig(max_generations=20, time_budget_s=math.inf),
        previous=found.plan,
    )
    assert not gone & set(again.plan.device_ids)
    assert memory_violations(smaller, MODEL, WORKLOAD, again.plan) == []
    intact = [p for p in found.plan.pipelines if not gone & set(p.device_ids)]
    assert {p.device_ids for p in intact} <= {p.device_ids for p in again.plan.pipelines}


def test_throughput_objective_reports_the_carried_rate_as_fitness(cluster):
    """Without a deadline a flat search's fitness is the estimated requests/s carried; the
    region-by-region search reports the same kind of figure, not an attainment."""
    workload = Workload(rate=50.0, s_out=16, num_requests=4000, objective="throughput")
    found = search(
        cluster,
        MODEL,
        workload,
        SearchConfig(max_generations=30, time_budget_s=math.inf, stall_generations=3, capacity=False),
    )
    [(fitness, simulated)] = found.finalists
    served_rps = simulated.throughput_tok_s / workload.s_out
    assert fitness[0] > 1.0  # requests/s, not a share
    assert 0.5 < fitness[0] / served_rps < 2.0  # a short trace: the simulation is not yet at steady state
