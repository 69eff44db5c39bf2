"""The simulations behind the disaggregation benchmark: a lone request's latency through a
prefill replica, its KV transfer and a decode replica; a colocated decode waiting behind a
prefill; and a disaggregated plan serving what its max flow estimates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hexswarm.routing.disaggregation.kv_transfer import kv_link
from hexswarm.routing.disaggregation.plan_record import DisaggregatedPlan, KvRoute, ReplicaPlan
from hexswarm.routing.disaggregation.planner import DisaggregationConfig, plan_disaggregated
from hexswarm.routing.disaggregation.simulation import (
    saturating_trace,
    simulate_colocated,
    simulate_disaggregated,
    steady_throughput,
)
from hexswarm.routing.scenarios.hexgen2_settings import rented_cluster
from hexswarm.routing.scheduler.model_spec import Workload, preset
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP, StageLayout
from hexswarm.routing.scheduler.plan import PipelinePlan, StagePlan
from hexswarm.routing.scheduler.simulation.simulator import Trace
from hexswarm.routing.scheduler.simulation.stage_costs import stage_costs

MODEL = preset("Llama-2-7B")
WORKLOAD = Workload(s_in=512, s_out=16, max_batch=8, objective="throughput")


def one_request(s_in: float) -> Trace:
    return Trace(np.array([0.0]), np.array([s_in]), WORKLOAD.s_out, math.inf)


def test_a_request_alone_takes_its_prefill_its_transfer_and_its_decode_steps():
    cluster = rented_cluster([("L40", 1), ("A6000", 1)])
    ids = cluster.ids
    plan = DisaggregatedPlan(
        MODEL.name,
        MODEL.num_layers,
        (
            ReplicaPlan("prefill", PipelinePlan((StagePlan((ids[0],), 0, 32),)), 1.0, 1.0),
            ReplicaPlan("decode", PipelinePlan((StagePlan((ids[1],), 0, 32),)), 1.0, 1.0, max_sequences=4),
        ),
        (KvRoute(0, 1, 1.0, 1.0),),
        512,
        WORKLOAD.s_out,
        WORKLOAD.max_batch,
    )
    trace = one_request(500.0)
    dp = PipelineDP(cluster, MODEL, WORKLOAD)
    prefill = dp.evaluate([StageLayout((0,), 0, 32)])
    decode = dp.evaluate([StageLayout((1,), 0, 32)])
    expected = (
        stage_costs(cluster, prefill, MODEL, trace.s_in, 1).prefill_s[0, 0]
        + kv_link(cluster, MODEL, prefill, decode).seconds(500.0)
        + WORKLOAD.s_out * stage_costs(cluster, decode, MODEL, trace.s_in, 8).step_s[0, 1]
    )
    # a second arrival much later keeps the run going past the first request's end
    trace = Trace(np.array([0.0, 1e6]), np.array([500.0, 500.0]), WORKLOAD.s_out, math.inf)
    done = simulate_disaggregated(cluster, MODEL, plan, trace, WORKLOAD)
    assert done[0] == pytest.approx(expected)


def test_a_colocated_decode_waits_behind_a_prefill_on_its_stage():
    cluster = rented_cluster([("L40", 1)])
    layout = PipelineDP(cluster, MODEL, WORKLOAD).evaluate([StageLayout((0,), 0, 32)])
    alone = simulate_colocated(cluster, MODEL, [layout], one_request(512.0), 8)[0]
    # a second prompt arrives while the first decodes: its prefill runs first, the decode waits
    trace = Trace(np.array([0.0, alone / 2]), np.array([512.0, 1024.0]), WORKLOAD.s_out, math.inf)
    both = simulate_colocated(cluster, MODEL, [layout], trace, 8)
    second_prefill = stage_costs(cluster, layout, MODEL, trace.s_in, 8).prefill_s[0, 1]
    assert both[0] >= alone + second_prefill * 0.99


def test_the_simulation_serves_what_the_max_flow_estimates():
    cluster = rented_cluster([("A100-80G", 2), ("L40", 2), ("A6000", 2)])
    plan = plan_disaggregated(cluster, MODEL, WORKLOAD, DisaggregationConfig(time_budget_s=60)).plan
    trace = saturating_trace(cluster, MODEL, WORKLOAD, seconds=20)
    done = simulate_disaggregated(cluster, MODEL, plan, trace, WORKLOAD)
    assert steady_throughput(trace, done) == pytest.approx(plan.throughput_tok_s, rel=0.1)


def test_steady_throughput_counts_the_saturated_window():
    trace = Trace(np.linspace(0, 100, 11), np.full(11, 10.0), 4, math.inf)
    done = np.array([10, 20, 30, 40, 50, 60, 70, 80, 90, 100, np.inf], dtype=float)
    # window (10 + 0.25 * 90, 100] = (32.5, 100]: 7 completions of 4 tokens in 67.5 s
    assert steady_throughput(trace, done) == pytest.approx(7 * 4 / 67.5)
    assert steady_throughput(trace, np.full(11, np.inf)) == 0.0
