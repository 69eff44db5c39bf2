"""The churn process, span chains and the churn simulation (routing/scenarios/churn_process.py, routing/sim/)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from hexswarm.routing.baselines.petals_policy import PetalsPolicy, StaticPolicy
from hexswarm.routing.scenarios.churn_process import draw_churn, split_machines
from hexswarm.routing.scheduler.cluster import Device, Network, build_cluster
from hexswarm.routing.scheduler.gpu_catalog import lookup
from hexswarm.routing.scheduler.model_spec import Workload, preset
from hexswarm.routing.scheduler.search.genetic import SearchConfig
from hexswarm.routing.scheduler.search.search import search
from hexswarm.routing.scheduler.simulation.simulator import make_trace
from hexswarm.routing.sim.churn_policy import SwarmView
from hexswarm.routing.sim.churn_sim import Sampling, run
from hexswarm.routing.sim.span_chains import PeerSpan, decompose

MODEL = preset("Llama-2-70B")


def test_churn_is_seeded_and_keeps_the_population():
    a = draw_churn(gpus=120, regions=4, minutes=60, seed=3)
    b = draw_churn(gpus=120, regions=4, minutes=60, seed=3)
    assert a.events == b.events and a.initial == b.initial
    assert draw_churn(gpus=120, regions=4, minutes=60, seed=4).events != a.events
    gpus = [sum(len(a.devices[m]) for m in a.present(t)) for t in np.arange(0, 3600, 300)]
    assert 0.5 * 120 <= min(gpus) and max(gpus) <= 1.6 * 120
    assert all(e1.time_s <= e2.time_s for e1, e2 in zip(a.events, a.events[1:], strict=False))
    leaves = sum(e.kind == "leave" for e in a.events)
    assert leaves >= len(a.initial) // 2  # 30-min sessions: most first peers leave within the hour


def test_churn_rejects_bad_arguments():
    with pytest.raises(ValueError):
        draw_churn(gpus=2, regions=4)


def _cluster():
    devices = []
    for name, region in (("a", "x"), ("b", "x"), ("c", "x"), ("d", "y")):
        devices.append(Device.from_spec(f"{name}-g0", lookup("A100-80G"), name, region))
    return build_cluster(devices, Network())


def test_decompose_builds_disjoint_chains_in_one_region_first():
    cluster = _cluster()
    spans = [
        PeerSpan("a", ("a-g0",), 0, 50),
        PeerSpan("b", ("b-g0",), 40, 80),
        PeerSpan("d", ("d-g0",), 50, 80),  # reaches as far, other region
        PeerSpan("c", ("c-g0",), 0, 30),
    ]
    chains = decompose(cluster, spans, 80)
    assert len(chains) == 1  # c cannot complete a second chain
    (chain,) = chains
    assert [(cluster.devices[s.devices[0]].machine, s.start, s.end) for s in chain] == [
        ("a", 0, 50),
        ("b", 50, 80),
    ]


def test_decompose_ignores_peers_that_left():
    cluster = _cluster()
    assert decompose(cluster, [PeerSpan("z", ("z-g0",), 0, 80)], 80) == []


@pytest.fixture(scope="module")
def small_run():
    churn = draw_churn(gpus=48, regions=2, minutes=4, seed=1)
    workload = Workload(rate=3.0, s_out=16, num_requests=100, max_batch=8)
    trace = make_trace(MODEL, replace(workload, num_requests=900))
    return churn, workload, trace


def test_petals_policy_run_is_deterministic(small_run):
    churn, workload, trace = small_run
    sampling = Sampling(sample_s=60, window_s=4, tick_s=10)
    first = run(churn, PetalsPolicy(MODEL, workload, seed=2), MODEL, workload, trace, sampling)
    again = run(churn, PetalsPolicy(MODEL, workload, seed=2), MODEL, workload, trace, sampling)
    assert first.samples == again.samples and first.moves == again.moves
    assert len(first.samples) == 4 and first.loads > 0
    att, tok = first.per_period(120)
    assert len(att) == len(tok) == 2 and all(0 <= a <= 1 for a in att)


def test_static_policy_follows_the_plan_then_places_joiners(small_run):
    churn, workload, _ = small_run
    first = churn.cluster(set(churn.initial))
    config = SearchConfig(
        max_generations=5, time_budget_s=math.inf, capacity=False, one_stage_per_machine=True
    )
    plan = search(first, MODEL, workload, config).plan
    policy = StaticPolicy(MODEL, workload, plan)
    machines = {m: churn.devices[m] for m in churn.initial}
    start = policy.decide(SwarmView(0.0, first, machines, {}, tuple(churn.initial)))
    assert {s.device_ids for s in start.spans.values()} == {
        st.device_ids for p in plan.pipelines for st in p.stages
    }
    assert policy.decide(SwarmView(10.0, first, machines, start.spans)).spans == {}  # nobody moves


def test_a_moving_peer_serves_its_old_range_until_the_new_one_is_loaded():
    from hexswarm.routing.scheduler.replan.moves import both_fit as _both_fit
    from hexswarm.routing.sim.churn_sim import _live

    old, new = PeerSpan("a", ("a-g0",), 0, 10), PeerSpan("a", ("a-g0",), 10, 20)
    spans, ready, before = {"a": new, "b": PeerSpan("b", ("b-g0",), 0, 80)}, {"a": 50.0}, {"a": old}
    assert _live(spans, ready, before, 40.0) == [old, spans["b"]]
    assert _live(spans, ready, before, 50.0) == [new, spans["b"]]
    assert _live(spans, ready, {}, 40.0, "a") is None  # break-before-make: nothing meanwhile
    # One A100-80G holds 10 + 10 layers of Llama-2-70B (1.7 GB each) but not 40 + 40.
    workload = Workload(max_batch=8)
    assert _both_fit(_cluster(), MODEL, workload, old, new)
    assert not _both_fit(
        _cluster(), MODEL, workload, PeerSpan("a", ("a-g0",), 0, 40), PeerSpan("a", ("a-g0",), 40, 80)
    )


def test_split_machines_runs_a_peer_per_k_gpus_that_the_plan_places_separately(small_run):
    churn, workload, _ = small_run
    split = split_machines(churn, 2)
    assert split.events == churn.events and split.devices == churn.devices  # machines come and go whole
    np.testing.assert_array_equal(split.pool.latency, churn.pool.latency)  # a machine's bus stays its bus
    for ids in churn.devices.values():
        peers = [split.pool.devices[split.pool.index(d)].machine for d in ids]
        assert len(set(peers)) == (len(ids) + 1) // 2
    with pytest.raises(ValueError):
        split_machines(churn, 0)
    first = split.cluster(set(churn.initial))
    config = SearchConfig(
        max_generations=5, time_budget_s=math.inf, capacity=False, one_stage_per_machine=True
    )
    plan = search(first, MODEL, workload, config).plan
    stages = [st for p in plan.pipelines for st in p.stages]
    peer = {d.id: d.machine for d in first.devices}
    assert all(len(st.device_ids) <= 2 and len({peer[d] for d in st.device_ids}) == 1 for st in stages)
    assert len({peer[st.device_ids[0]] for st in stages}) == len(stages)  # one stage per peer
    machines = {m: churn.devices[m] for m in churn.initial}
    policy = StaticPolicy(MODEL, workload, plan, server_gpus=2)
    start = policy.decide(SwarmView(0.0, first, machines, {}, tuple(churn.initial)))
    assert set(start.spans) == {peer[st.device_ids[0]] for st in stages}


def test_petals_runs_one_server_per_gpu_by_default_flag_and_they_leave_with_their_machine(small_run):
    churn, workload, trace = small_run
    first = churn.cluster(set(churn.initial))
    machines = {m: churn.devices[m] for m in churn.initial}
    per_gpu = PetalsPolicy(MODEL, workload, seed=2, server_gpus=1)
    assert per_gpu.name == "petals-gpu" and PetalsPolicy(MODEL, workload).name == "petals"
    spans = per_gpu.decide(SwarmView(0.0, first, machines, {}, tuple(churn.initial))).spans
    assert all(len(span.device_ids) == 1 and span.machine == span.device_ids[0] for span in spans.values())
    assert len(spans) == sum(len(d) for d in machines.values())  # every GPU of the mix holds a block
    per_machine = PetalsPolicy(MODEL, workload, seed=2).decide(
        SwarmView(0.0, first, machines, {}, tuple(churn.initial))
    )
    assert set(per_machine.spans) == set(machines)
    per_pair = PetalsPolicy(MODEL, workload, seed=2, server_gpus=2)
    assert per_pair.name == "petals-2gpu"
    pairs = per_pair.decide(SwarmView(0.0, first, machines, {}, tuple(churn.initial))).spans
    assert all(len(span.device_ids) <= 2 for span in pairs.values())
    assert len(pairs) == sum((len(d) + 1) // 2 for d in machines.values())
    for bad in (-1, "rack", 1.5, True):
        with pytest.raises(ValueError):
            PetalsPolicy(MODEL, workload, server_gpus=bad)
    # A leaving machine takes all its servers with it.
    from hexswarm.routing.sim.churn_sim import _peers_of

    machine = max(machines, key=lambda m: len(machines[m]))
    assert sorted(_peers_of(spans, machines[machine])) == sorted(machines[machine])
    sampling = Sampling(sample_s=60, window_s=4, tick_s=10)
    result = run(
        churn, PetalsPolicy(MODEL, workload, seed=2, server_gpus=1), MODEL, workload, trace, sampling
    )
    assert result.loads >= len(spans) and len(result.samples) == 4


def test_churn_benchmark_prints_one_json_line_with_the_peer_split_policies():
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    args = "--gpus 24 --regions 2 --minutes 2 --initial-generations 5 --generations 3 --peer-gpus 2"
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "churn.py"), *args.split()],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.splitlines()
    assert len(out) == 1
    rows = json.loads(out[0])["policies"]
    assert set(rows) == {"coordinator", "petals", "petals-gpu", "petals-2gpu", "no-replan"}
    assert all(0.0 <= row["attainment"] <= 1.0 for row in rows.values())
    assert "attainment_vs_petals_2gpu" in rows["coordinator"]
