"""HexGen-2's planner on plain data: the replicas' layouts in their roles, the refinement of
§3.4 (no kept swap lowers the flow), the plan's dispatch ratios and record, determinism, and
the swarm's form (whole machines)."""

from __future__ import annotations

import json
import random
import time

import pytest

from hexswarm.routing.disaggregation.graph import build_graph
from hexswarm.routing.disaggregation.partition import initial_partition
from hexswarm.routing.disaggregation.placement import Evaluator, make_state
from hexswarm.routing.disaggregation.plan_record import DisaggregatedPlan
from hexswarm.routing.disaggregation.planner import DisaggregationConfig, plan_disaggregated
from hexswarm.routing.disaggregation.refine import refine_guided, refine_random
from hexswarm.routing.disaggregation.replica import ReplicaPlanner
from hexswarm.routing.disaggregation.roles import DECODE, PREFILL, secondary_partition
from hexswarm.routing.scenarios.hexgen2_settings import rented_cluster
from hexswarm.routing.scheduler.model_spec import Workload, preset
from hexswarm.routing.scheduler.plan import PlanError
from hexswarm.routing.scheduler.search.search_result import NoFeasiblePlanError

MODEL = preset("Llama-2-7B")
WORKLOAD = Workload(s_in=512, s_out=64, max_batch=8, objective="throughput")
MACHINES = [("A100-80G", 2), ("L40", 2), ("A6000", 2)]


@pytest.fixture(scope="module")
def cluster():
    return rented_cluster(MACHINES)


@pytest.fixture(scope="module")
def result(cluster):
    return plan_disaggregated(cluster, MODEL, WORKLOAD, DisaggregationConfig(time_budget_s=60))


def start(cluster, k=3):
    graph = build_graph(cluster, MODEL)
    ev = Evaluator(graph, ReplicaPlanner(cluster, MODEL, WORKLOAD))
    groups = initial_partition(graph, k)
    return ev, ev.evaluate(make_state(groups, secondary_partition(graph, groups)))


def test_prefill_layouts_are_latency_optimal_and_decode_ones_rated_by_throughput(cluster):
    planner = ReplicaPlanner(cluster, MODEL, WORKLOAD)
    group = (2, 3)  # the two L40s of one machine
    prefill, decode = planner.replica(PREFILL, group), planner.replica(DECODE, group)
    assert prefill.layout.prefill_s <= min(
        planner.replica(PREFILL, (2,)).layout.prefill_s, planner.replica(PREFILL, (3,)).layout.prefill_s
    )
    assert prefill.capacity_rps > 0 and decode.capacity_rps > 0 and decode.max_sequences > 0
    assert prefill.max_sequences == 0
    assert planner.replica(DECODE, group) is decode  # cached


def test_kept_swaps_never_lower_the_flow(cluster):
    for refine in (
        lambda ev, p, trail: refine_guided(ev, p, time.perf_counter() + 30, trail),
        lambda ev, p, trail: refine_random(ev, p, time.perf_counter() + 30, random.Random(3), trail),
    ):
        ev, first = start(cluster)
        trail = []
        final, kept = refine(ev, first, trail)
        values = [first.value_rps] + [v for _, v in trail]
        assert len(trail) == kept and values == sorted(values)
        assert final.value_rps == values[-1] >= first.value_rps


def test_the_plan_covers_the_model_in_both_roles(result):
    plan = result.plan
    assert {r.role for r in plan.replicas} == {PREFILL, DECODE}
    for replica in plan.replicas:
        assert replica.stages[0].start == 0 and replica.stages[-1].end == MODEL.num_layers
        assert all(a.end == b.start for a, b in zip(replica.stages, replica.stages[1:], strict=False))
    devices = [d for r in plan.replicas for d in r.device_ids]
    assert len(devices) == len(set(devices))
    assert plan.throughput_tok_s == pytest.approx(result.placement.value_rps * WORKLOAD.s_out)


def test_dispatch_ratios_sum_to_one_per_prefill_replica(result):
    plan = result.plan
    dispatch = plan.dispatch()
    assert set(dispatch) == set(plan.indices(PREFILL))
    for row in dispatch.values():
        assert sum(row.values()) == pytest.approx(1.0)
        assert all(plan.replicas[j].role == DECODE for j in row)
    assert sum(plan.prefill_share().values()) == pytest.approx(1.0)
    # flows are conserved: what the prefill replicas send is what the decode replicas receive
    sent = sum(r.flow_rps for r in plan.replicas if r.role == PREFILL)
    assert sent == pytest.approx(sum(r.flow_rps for r in plan.replicas if r.role == DECODE))
    assert sent == pytest.approx(sum(k.flow_rps for k in plan.routes))


def test_a_plan_is_deterministic_for_a_seed(cluster, result):
    again = plan_disaggregated(cluster, MODEL, WORKLOAD, DisaggregationConfig(time_budget_s=60))
    assert again.plan == result.plan
    random_swaps = DisaggregationConfig(time_budget_s=60, swaps="random", seed=5)
    assert (
        plan_disaggregated(cluster, MODEL, WORKLOAD, random_swaps).plan
        == plan_disaggregated(cluster, MODEL, WORKLOAD, random_swaps).plan
    )


def test_the_plan_round_trips_through_json(result):
    raw = json.loads(result.plan.to_json())
    assert DisaggregatedPlan.from_dict(raw) == result.plan
    assert raw["schema_version"] == 1 and raw["throughput_tok_s"] == pytest.approx(
        result.plan.throughput_tok_s
    )
    with pytest.raises(PlanError):
        DisaggregatedPlan.from_dict({**raw, "schema_version": 99})
    with pytest.raises(PlanError):
        DisaggregatedPlan.from_dict({**raw, "replicas": [{"role": "both"}]})


def test_a_swarm_plan_gives_each_machine_one_stage():
    cluster = rented_cluster([("L40", 2), ("L40", 1), ("A6000", 2), ("A6000", 1)])
    config = DisaggregationConfig(time_budget_s=60, whole_machines=True)
    plan = plan_disaggregated(cluster, MODEL, WORKLOAD, config).plan
    machines = [
        {cluster.devices[cluster.index(d)].machine for d in s.device_ids}
        for r in plan.replicas
        for s in r.stages
    ]
    assert all(len(m) == 1 for m in machines)
    assert len(machines) == len({m.pop() for m in machines})


def test_too_little_memory_for_two_replicas_is_refused():
    with pytest.raises(NoFeasiblePlanError):
        plan_disaggregated(rented_cluster([("L40", 2)]), preset("Llama-2-70B"), WORKLOAD)
    with pytest.raises(NoFeasiblePlanError):
        plan_disaggregated(rented_cluster([("L40", 1)]), MODEL, WORKLOAD)


def test_prefill_layouts_ranked_by_throughput_serve_at_least_as_many_prompts(cluster):
    latency = ReplicaPlanner(cluster, MODEL, WORKLOAD)
    throughput = ReplicaPlanner(cluster, MODEL, WORKLOAD, prefill_layout="throughput")
    for group in ((0, 1), (2, 3), (0, 1, 4, 5)):
        fast, many = latency.replica(PREFILL, group), throughput.replica(PREFILL, group)
        assert many.capacity_rps >= fast.capacity_rps * (1 - 1e-9)
        assert fast.layout.prefill_s <= many.layout.prefill_s * (1 + 1e-9)
    with pytest.raises(ValueError):
        ReplicaPlanner(cluster, MODEL, WORKLOAD, prefill_layout="fastest")
