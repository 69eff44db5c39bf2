"""Make-before-break move valuation, the no-moves ablation and the churn split (moves.py, replan.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hexswarm.routing.scheduler.cluster import Device, Network, build_cluster
from hexswarm.routing.scheduler.gpu_catalog import lookup
from hexswarm.routing.scheduler.model_spec import Workload, preset
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout, StageLayout
from hexswarm.routing.scheduler.replan.moves import (
    Assignment,
    horizon_attainment,
    make_before_break_loads,
    old_pipeline_ends,
)
from hexswarm.routing.scheduler.simulation.fitness import PipelineCapacity
from hexswarm.routing.sim.churn_sim import PolicyRun

MODEL = preset("Llama-2-70B")
WORKLOAD = Workload(max_batch=8)
ONE = PipelineCapacity(np.array([1.0]), np.array([1.0]))  # 1 request/s within the SLO


def _cluster():
    devices = [Device.from_spec(f"{m}-g0", lookup("A100-80G"), m, "x") for m in "abcd"]
    return build_cluster(devices, Network())


def _layout(*stages: tuple[int, int, int]) -> PipelineLayout:
    return PipelineLayout(tuple(StageLayout((d,), s, e) for d, s, e in stages), 1.0, 1.0)


def test_old_pipelines_serve_until_their_end_in_the_horizon_value():
    # the new pipeline is ready at 50 of 100 s; without the old one half the horizon is lost
    assert horizon_attainment([ONE], [50.0], 1.0, 100.0) == pytest.approx(0.5)
    assert horizon_attainment([ONE], [50.0], 1.0, 100.0, old=[(ONE, 50.0)]) == pytest.approx(1.0)
    assert horizon_attainment([ONE], [50.0], 1.0, 100.0, old=[(ONE, 0.0)]) == pytest.approx(0.5)


def test_a_peer_whose_ranges_both_fit_loads_its_whole_new_range_while_serving_the_old():
    cluster = _cluster()
    current = {"a": Assignment(("a-g0",), 0, 10), "b": Assignment(("b-g0",), 0, 40)}
    new = {"a": Assignment(("a-g0",), 10, 20), "b": Assignment(("b-g0",), 40, 80)}
    load, keeps = make_before_break_loads(cluster, MODEL, WORKLOAD, current, new, {"a": 1.0, "b": 2.0}, 1e9)
    assert keeps == {"a"}  # 10 + 10 layers fit on an A100-80G, 40 + 40 do not
    assert load["a"] == pytest.approx(10 * MODEL.layer_bytes / 1e9) and load["b"] == 2.0


def test_old_pipeline_ends_when_its_peers_switch():
    cluster = _cluster()
    old = _layout((0, 0, 40), (1, 40, 80))
    # a moves make-before-break (loaded at 30 s): the old pipeline serves until then
    new = [_layout((0, 0, 20), (2, 20, 80))]
    assert old_pipeline_ends(cluster, [old], new, {"a": 30.0, "c": 60.0}, frozenset("a")) == [30.0]
    # break-before-make: the old pipeline stops at once
    assert old_pipeline_ends(cluster, [old], new, {"a": 30.0, "c": 60.0}, frozenset()) == [0.0]
    # kept unchanged: the new plan counts it; peers left out keep serving it
    assert old_pipeline_ends(cluster, [old], [old], {}, frozenset()) == [0.0]
    assert old_pipeline_ends(cluster, [old], [_layout((2, 0, 80))], {"c": 5.0}, frozenset()) == [float("inf")]


def test_split_attainment_after_a_leave_and_steady():
    run = PolicyRun("x", samples=[(10.0, 1, 2, 0.0), (100.0, 4, 4, 0.0), (130.0, 0, 2, 0.0)])
    split = run.split_attainment([90.0], after_s=30.0)
    assert split["after_leave"] == pytest.approx(4 / 4) and split["after_leave_samples"] == 1
    assert split["steady"] == pytest.approx(1 / 4) and split["steady_samples"] == 2
