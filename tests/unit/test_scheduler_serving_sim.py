"""Event-driven serving simulator (routing.scheduler.simulation.serving_sim) against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from hexswarm.routing.scheduler.cluster import Device, Network, build_cluster
from hexswarm.routing.scheduler.cost_model import comp_cost, pipeline_cost
from hexswarm.routing.scheduler.gpu_catalog import lookup
from hexswarm.routing.scheduler.model_spec import Workload, preset
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout, StageLayout
from hexswarm.routing.scheduler.simulation.serving import evaluate_layouts
from hexswarm.routing.scheduler.simulation.serving_sim import simulate_pipeline
from hexswarm.routing.scheduler.simulation.simulator import Trace
from hexswarm.routing.scheduler.simulation.stage_costs import StageCosts, stage_costs


def hand_costs(prefill: float, step: list[float], stages: int = 2, budget: float = 1e12) -> StageCosts:
    """Stages with prefill `prefill` s, decode step of b sequences `step[b]` s, no hops."""
    steps = np.tile(np.asarray([0.0] + step), (stages, 1))
    return StageCosts(
        prefill_s=np.full((stages, 4), prefill),
        step_s=steps,
        hop_prefill_s=np.zeros((stages, 4)),
        hop_step_s=np.zeros_like(steps),
        kv_budget=np.full(stages, budget),
        kv_per_token=np.ones(stages),
    )


def test_two_stage_pipeline_overlaps_two_concurrent_requests():
    costs = hand_costs(prefill=1.0, step=[1.0])  # max_batch 1: pipelining alone
    done = simulate_pipeline(costs, np.array([0.0, 0.0]), np.array([2.0, 2.0]), s_out=1)
    # A: prefill on stage 0 [0, 1], stage 1 [1, 2]; B: stage 0 [1, 2] while A is on stage 1.
    # Prefill goes first, so B's prefill on stage 1 [2, 3] runs before A's decode step there:
    # A decode stage 0 [2, 3], stage 1 [3, 4]; B decode stage 0 [3, 4], stage 1 [4, 5].
    assert done.tolist() == [4.0, 5.0]
    # One request at a time (the sequential model) would end at 4 and 8.
    assert done.max() < 2 * 4.0


def test_a_batched_step_costs_the_scan_once():
    costs = hand_costs(prefill=0.5, step=[1.0, 1.25], stages=1)  # scan 0.75 s + 0.25 s per sequence
    done = simulate_pipeline(costs, np.array([0.0, 0.0]), np.array([2.0, 2.0]), s_out=2)
    # prefills [0, 0.5] and [0.5, 1]; then two decode steps of both sequences, 1.25 s each
    assert done.tolist() == [3.5, 3.5]  # alone, each step would take 1 s: [1, 3] and [3, 5]

    cluster = build_cluster([Device.from_spec("g", lookup("A6000"), "m", "r")], Network())
    model = preset("Llama-2-7B")
    layout = PipelineLayout((StageLayout((0,), 0, 32),), 0.0, 0.0)
    table = stage_costs(cluster, layout, model, [128.0], max_batch=4)
    scan = (
        comp_cost(cluster, (0,), model, 32, 128.0, 1).decode
        - comp_cost(cluster, (0,), model, 32, 128.0, 1).prefill / 128
    )
    flops = table.step_s[0, 2] - table.step_s[0, 1]
    assert table.step_s[0, 4] == pytest.approx(scan + 4 * flops)
    assert table.step_s[0, 1] == pytest.approx(scan + flops)


def test_admission_stops_at_the_kv_limit():
    # Each request holds 10 tokens of KV; the budget holds two requests at once.
    costs = hand_costs(prefill=1.0, step=[1.0, 1.0, 1.0], stages=1, budget=20.0)
    done = simulate_pipeline(costs, np.zeros(3), np.full(3, 10.0), s_out=1)
    # A and B are admitted: prefills [0, 1] and [1, 2], then one batched decode [2, 3].
    # C waits for their memory, then runs alone: prefill [3, 4], decode [4, 5].
    assert done.tolist() == [3.0, 3.0, 5.0]
    roomy = simulate_pipeline(hand_costs(1.0, [1.0, 1.0, 1.0], 1, 30.0), np.zeros(3), np.full(3, 10.0), 1)
    assert roomy.max() == 4.0  # with room for three, all decode in one step after the prefills


def test_a_request_alone_takes_eq2_latency():
    cluster = build_cluster(
        [Device.from_spec(f"g{i}", lookup("A6000"), f"m{i // 2}", "r") for i in range(4)], Network()
    )
    model = preset("Llama-2-70B")
    layout = PipelineLayout((StageLayout((0, 1), 0, 40), StageLayout((2, 3), 40, 80)), 0.0, 0.0)
    s_in, s_out = 100.0, 8
    costs = stage_costs(cluster, layout, model, [s_in], max_batch=8)
    done = simulate_pipeline(costs, np.array([0.0]), np.array([s_in + s_out]), s_out)
    specs = [layout.stages[0], layout.stages[1]]
    from hexswarm.routing.scheduler.cost_model import StageSpec

    eq2 = pipeline_cost(cluster, [StageSpec(s.devices, s.layers) for s in specs], model, s_in, s_out)
    assert done[0] == pytest.approx(float(eq2.total))


def test_sequential_ablation_and_pipelined_serving_agree_at_light_load():
    cluster = build_cluster(
        [Device.from_spec(f"g{i}", lookup("A6000"), "m", "r") for i in range(4)], Network()
    )
    model = preset("Llama-2-70B")
    layout = PipelineLayout((StageLayout((0, 1), 0, 40), StageLayout((2, 3), 40, 80)), 0.0, 0.0)
    trace = Trace(np.array([0.0, 100.0]), np.array([64.0, 64.0]), 8, deadline_s=100.0)
    results = [
        evaluate_layouts(cluster, [layout], model, trace, Workload(serving=mode))
        for mode in ("sequential", "pipelined-batched")
    ]
    assert results[0].mean_latency_s == pytest.approx(results[1].mean_latency_s)
    assert results[0].attainment == results[1].attainment == 1.0
