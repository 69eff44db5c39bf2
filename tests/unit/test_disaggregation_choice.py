"""The chooser (routing/disaggregation/choice.py) that keeps a disaggregated plan only where it
serves more than the colocated one, and the coordinator's call into it (`choose_planned`)."""

from __future__ import annotations

import logging
import math

import pytest

from hexswarm.routing.disaggregation.choice import Choice, choose
from hexswarm.routing.disaggregation.plan_record import DisaggregatedPlan, KvRoute, ReplicaPlan
from hexswarm.routing.disaggregation.simulation import (
    saturating_trace,
    simulate_colocated,
    simulate_disaggregated,
    steady_throughput,
)
from hexswarm.routing.scenarios.hexgen2_settings import rented_cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload, preset
from hexswarm.routing.scheduler.plan import PipelinePlan, Plan, StagePlan
from hexswarm.routing.scheduler.plan_eval import plan_layouts
from hexswarm.routing.scheduler.search.genetic import SearchConfig
from hexswarm.routing.scheduler.simulation.interference import MEASURED
from hexswarm.swarm.coordinator.planner import choose_planned, compute_disaggregated_plan, compute_plan
from hexswarm.swarm.trust.records import DeviceInfo, PeerRecord, PeerState

MODEL = preset("Llama-2-7B")
WORKLOAD = Workload(s_in=512, s_out=16, max_batch=16, objective="throughput")  # prompts dominate
CLUSTER = rented_cluster([("L40", 2)])  # two GPUs, each holds the whole model
SECONDS = 20.0  # of arrivals: the replicas fill within a few seconds


def whole(device: str) -> PipelinePlan:
    return PipelinePlan((StagePlan((device,), 0, MODEL.num_layers),))


# Each GPU serves whole requests, or one prefills and the other decodes.
COLOCATED = Plan(MODEL.name, MODEL.num_layers, tuple(whole(d) for d in CLUSTER.ids))
DISAGGREGATED = DisaggregatedPlan(
    MODEL.name,
    MODEL.num_layers,
    (
        ReplicaPlan("prefill", whole(CLUSTER.ids[0]), 1.0, 1.0),
        ReplicaPlan("decode", whole(CLUSTER.ids[1]), 1.0, 1.0, max_sequences=32),
    ),
    (KvRoute(0, 1, 1.0, 1.0),),
    WORKLOAD.s_in,
    WORKLOAD.s_out,
    WORKLOAD.max_batch,
)


def test_the_reason_names_what_was_kept_with_both_figures():
    kept = Choice(True, 1000.0, 1234.4)
    assert kept.chosen_tok_s == 1234.4
    assert kept.reason == "disaggregated (1234 tok/s against 1000 tok/s colocated, 1.23 x)"
    colocated = Choice(False, 1000.0, 900.0)
    assert colocated.chosen_tok_s == 1000.0
    assert colocated.reason.startswith("colocated (1000 tok/s against 900 tok/s disaggregated, 0.90 x")
    assert (
        Choice(True, None, 500.0).reason
        == "disaggregated (500 tok/s disaggregated; no colocated plan to compare)"
    )
    assert Choice(False, 800.0, None).reason == "colocated (800 tok/s; no disaggregated plan)"


def test_both_plans_are_measured_on_one_trace_and_the_better_is_kept():
    trace = saturating_trace(CLUSTER, MODEL, WORKLOAD, SECONDS)
    choice = choose(CLUSTER, MODEL, WORKLOAD, COLOCATED, DISAGGREGATED, trace=trace, interference=None)
    layouts = plan_layouts(CLUSTER, MODEL, WORKLOAD, COLOCATED)
    colocated = steady_throughput(
        trace, simulate_colocated(CLUSTER, MODEL, layouts, trace, WORKLOAD.max_batch)
    )
    disaggregated = steady_throughput(
        trace, simulate_disaggregated(CLUSTER, MODEL, DISAGGREGATED, trace, WORKLOAD)
    )
    assert (choice.colocated_tok_s, choice.disaggregated_tok_s) == (colocated, disaggregated)
    assert choice.disaggregated == (disaggregated > colocated)
    assert choice.chosen_tok_s == max(colocated, disaggregated) > 0


def test_interference_costs_the_colocated_plan_alone_and_can_turn_the_choice():
    """With prompts that dominate, two GPUs serving whole requests beat one prefilling for the
    other while a prefill costs only its time (537 against 450 tok/s); at the interference
    measured on a peer (a 512-token prompt next to decoding sequences costs 1.73 x), they do
    not (340)."""
    plain = choose(CLUSTER, MODEL, WORKLOAD, COLOCATED, DISAGGREGATED, interference=None, seconds=SECONDS)
    measured = choose(
        CLUSTER, MODEL, WORKLOAD, COLOCATED, DISAGGREGATED, interference=MEASURED, seconds=SECONDS
    )
    assert plain.disaggregated_tok_s == measured.disaggregated_tok_s
    assert plain.colocated_tok_s > measured.colocated_tok_s
    assert not plain.disaggregated and measured.disaggregated


def test_without_a_colocated_figure_the_disaggregated_plan_is_kept_if_it_serves():
    choice = choose(CLUSTER, MODEL, WORKLOAD, None, DISAGGREGATED, seconds=SECONDS)
    assert choice.disaggregated and choice.colocated_tok_s is None and choice.chosen_tok_s > 0
    alone = choose(CLUSTER, MODEL, WORKLOAD, COLOCATED, None, seconds=SECONDS)
    assert not alone.disaggregated and alone.disaggregated_tok_s is None
    with pytest.raises(ValueError):
        choose(CLUSTER, MODEL, WORKLOAD, None, None)


SMOL = ModelSpec("smol", 30, 576, 4)  # SmolLM2's shape
CPU_SEARCH = SearchConfig(max_generations=60, time_budget_s=math.inf, stall_generations=30, capacity=False)


def cpu_peer(name: str) -> PeerRecord:
    return PeerRecord(
        name, name, "smol", 0, 30, PeerState.ONLINE, 20000.0, 0.5, 1000, 0, 2048, "float32", "cpu", "0",
        devices=(DeviceInfo("cpu", "cpu", 16 * 2**30, 2),), auto=True, max_blocks=30,
    )  # fmt: skip


def test_the_coordinator_keeps_the_plan_the_chooser_picks():
    """Two CPU peers that each hold the model: the coordinator's two plans of them, scored on
    one cluster of all the records; the one kept is the one the choice names."""
    peers = [cpu_peer("a"), cpu_peer("b")]
    workload = Workload(s_in=128, s_out=32, objective="throughput")
    colocated = compute_plan(peers, SMOL, workload, CPU_SEARCH)
    disaggregated = compute_disaggregated_plan(peers, SMOL, workload, budget_s=30.0)
    kept, choice = choose_planned(peers, SMOL, workload, colocated, disaggregated)
    assert choice.colocated_tok_s > 0 and choice.disaggregated_tok_s > 0
    assert kept is (disaggregated if choice.disaggregated else colocated)
    assert sorted(disaggregated.roles.values()) == ["decode", "prefill"]


@pytest.mark.parametrize("force", [False, True])
def test_the_coordinator_disaggregates_only_where_it_pays_unless_forced(force, caplog):
    """The two CPU peers above serve more colocated: `--disaggregated` keeps the colocated
    plan and logs one line with both figures; `--force-disaggregated` keeps the roles."""
    from hexswarm.swarm.coordinator.service import Coordinator, CoordinatorConfig
    from hexswarm.swarm.net.identity import load_or_create_identity

    workload = Workload(s_in=128, s_out=32, objective="throughput")
    config = CoordinatorConfig(
        "smol-id", SMOL, workload, search=CPU_SEARCH, disaggregated=True, force_disaggregated=force
    )
    coordinator = Coordinator(None, load_or_create_identity(None), config)
    with caplog.at_level(logging.INFO, logger="hexswarm.swarm.coordinator.service"):
        planned = coordinator._plan([cpu_peer("a"), cpu_peer("b")])
    lines = [r.getMessage() for r in caplog.records if "planned" in r.getMessage()]
    if force:
        assert sorted(planned.roles.values()) == ["decode", "prefill"] and not lines
    else:
        assert not planned.roles and planned.plan is not None
        assert len(lines) == 1 and lines[0].startswith("smol-id: planned colocated (")
        assert lines[0].count("tok/s") == 2, lines


def test_a_forced_coordinator_replaces_the_colocated_plan_it_made_for_one_peer():
    """Under load the second `--role auto` peer joined 24 s after the first: the forced
    coordinator had published a colocated plan of the one peer (nothing to split), and its
    split plan of both, estimated at 0% attainment on a busy CPU, did not `beat` it, so the
    peers stayed unsplit. The first split plan replaces a colocated one whatever the estimates;
    an unforced coordinator still compares them."""
    from hexswarm.swarm.coordinator.service import first_split, plan_record

    workload = Workload(s_in=128, s_out=32, objective="throughput")
    alone = compute_plan([cpu_peer("a")], SMOL, workload, CPU_SEARCH)
    published = plan_record("smol-id", "C", [cpu_peer("a")], alone, 1)
    split = compute_disaggregated_plan([cpu_peer("a"), cpu_peer("b")], SMOL, workload, budget_s=30.0)
    assert first_split(published, split, forced=True)
    assert not first_split(published, split, forced=False)
    assert not first_split(published, alone, forced=True)
    resplit = plan_record("smol-id", "C", [cpu_peer("a"), cpu_peer("b")], split, 2)
    assert not first_split(resplit, split, forced=True)  # a split plan is compared as before
