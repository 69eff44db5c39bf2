"""The coordinator's pure logic: records and signatures, debounce, margin, moves, versions, cluster view."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from hexswarm.routing.scheduler.cluster import Device
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.search.genetic import SearchConfig
from hexswarm.swarm.coordinator.cluster_view import build_view, device_ids, peer_of, regions_of
from hexswarm.swarm.coordinator.moves import Move, Placement, diff, kind_of, layers_to_load, rematch
from hexswarm.swarm.coordinator.planner import Planned, compute_plan, petals_placement
from hexswarm.swarm.coordinator.records import (
    Assignment,
    CoordinationRecordError,
    Lease,
    PlanRecord,
    coordination_from,
    current_holder,
    plans_from,
)
from hexswarm.swarm.coordinator.triggers import ReplanPolicy, ReplanTrigger, beats
from hexswarm.swarm.trust.records import DeviceInfo, PeerRecord, PeerState, link_tag

MODEL = ModelSpec("tiny", 8, 128, 4)
# Searches stop after a set number of generations (or a stall), never on the clock: a wall-clock
# budget would make the plan, and so these assertions, depend on the machine's load.
TINY_SEARCH = SearchConfig(max_generations=400, time_budget_s=math.inf, capacity=False)  # < 1 s on this model


def record(peer: str, start: int, end: int, auto: bool = True, max_blocks: int = 4, **kw) -> PeerRecord:
    fields = dict(throughput=5000.0, region="", links=())
    fields.update(kw)
    return PeerRecord(
        peer, peer, "tiny", start, end, PeerState.ONLINE, fields["throughput"], 0.5, 1000, 0, 2048,
        "float32", "cpu", "0", devices=(DeviceInfo("cpu", "cpu", 16 * 2**30, 2),), auto=auto,
        max_blocks=max_blocks, region=fields["region"],
        links=tuple((link_tag(other), ms) for other, ms in fields["links"]),
    )  # fmt: skip


def plan(version: int, coordinator: str = "A", assignments=(("p1", 0, 4),)) -> PlanRecord:
    return PlanRecord("m", version, coordinator, "h", 0.9, 100.0, tuple(Assignment(*a) for a in assignments))


# Records -------------------------------------------------------------------------------------


def test_lease_and_plan_round_trip_through_msgpack():
    lease = Lease("m", "A", 12.5)
    assert Lease.from_bytes(lease.to_bytes()) == lease
    p = plan(3, assignments=(("p1", 0, 4), ("p2", 4, 8, 2)))
    assert PlanRecord.from_bytes(p.to_bytes()) == p
    assert p.assignment_of("p2") == Assignment("p2", 4, 8, 2) and p.assignment_of("p3") is None
    roles = plan(4, assignments=(("p1", 0, 8, 1, "prefill"), ("p2", 0, 8, 1, "decode"), ("p3", 0, 8)))
    assert PlanRecord.from_bytes(roles.to_bytes()) == roles
    assert [a.role for a in roles.assignments] == ["prefill", "decode", "both"]
    assert roles.to_dict()["assignments"][2] == ["p3", 0, 8, 1]  # no role: the form older readers read


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b.update(schema=2),
        lambda b: b.update(version=0),
        lambda b: b.update(version=True),
        lambda b: b.update(assignments=[["p1", 4, 2, 1]]),
        lambda b: b.update(assignments=[["p1", 0, 4, 1], ["p1", 4, 8, 1]]),
        lambda b: b.update(attainment="high"),
        lambda b: b.update(missing=[-1]),
        lambda b: b.update(missing="0:4"),
        lambda b: b.update(missing=list(range(5000))),
        lambda b: b.update(memory_short_blocks=-3),
        lambda b: b.update(
            assignments=[["p1", 0, 4, 1, "auto"]]
        ),  # roles a plan gives: prefill, decode, both
        lambda b: b.update(assignments=[["p1", 0, 4, 1, "decode", 0]]),
    ],
)
def test_malformed_plans_are_refused(mutate):
    import msgpack

    body = plan(1).to_dict()
    mutate(body)
    with pytest.raises(CoordinationRecordError):
        PlanRecord.from_bytes(msgpack.packb(body))


def test_a_released_lease_no_longer_holds_and_round_trips():
    held, released = Lease("m", "A", 1.0), Lease("m", "A", 1.0, released=True)
    assert Lease.from_bytes(released.to_bytes()) == released and Lease.from_bytes(held.to_bytes()) == held
    later = Lease("m", "B", 5.0)
    assert current_holder([("A", released), ("B", later)], "m") == later
    assert current_holder([("A", released)], "m") is None


def test_forged_leases_are_dropped_and_the_earliest_claim_holds():
    a, b = Lease("m", "A", 10.0), Lease("m", "B", 5.0)
    assert current_holder([("A", a), ("B", b)], "m") == b
    # B's claim signed by C: forged, ignored; the earliest valid claim wins.
    assert current_holder([("A", a), ("C", b)], "m") == a
    assert current_holder([("A", Lease("other", "A", 1.0))], "m") is None
    # Claims at the same instant: the smaller peer id wins, so both candidates agree.
    assert current_holder([("B", Lease("m", "B", 5.0)), ("A", Lease("m", "A", 5.0))], "m").holder == "A"


def test_plans_signed_by_others_than_their_coordinator_or_by_non_holders_are_not_followed():
    signed = plans_from([("A", plan(2, "A")), ("X", plan(99, "A")), ("X", plan(50, "X"))], "m")
    assert [(p.coordinator, p.version) for p in signed] == [("A", 2), ("X", 50)]  # the forgery is gone
    c = coordination_from([("A", Lease("m", "A", 1.0))], signed, "m")
    assert c.plan.version == 2 and c.newest_version == 50  # X's plan is signed, but X holds no lease
    assert [p.version for p in c.others] == [50]
    assert coordination_from([], signed, "m").plan is None  # no holder: nobody's plan is followed


def test_new_peer_record_fields_round_trip_and_old_readers_fields_default():
    r = record("p", 0, 4, links=(("q", 1.5),), region="eu")
    back = PeerRecord.from_bytes(r.to_bytes())
    assert back == r and back.links == ((link_tag("q"), 1.5),)


# Triggers ------------------------------------------------------------------------------------


def test_a_burst_of_joins_makes_one_replan_after_the_debounce():
    policy = ReplanPolicy(debounce_s=5, max_delay_s=30, period_s=300)
    t = ReplanTrigger(policy, now=0)
    t.observe({"a": (1.0, False)}, now=0)
    t.planned(now=0)
    view = {"a": (1.0, False)}
    for i, now in enumerate([10, 12, 14, 16]):  # a join every 2 s
        view = {**view, f"j{i}": (1.0, False)}
        t.observe(view, now)
        assert t.due(now + 1) is None
    assert t.due(20) is None and t.due(21) is not None  # 5 s after the last join
    t.planned(21)
    assert t.due(22) is None


def test_a_steady_trickle_cannot_postpone_the_replan_past_max_delay():
    t = ReplanTrigger(ReplanPolicy(debounce_s=5, max_delay_s=12, period_s=300), now=0)
    view = {}
    for now in range(0, 13, 2):
        view = {**view, f"p{now}": (1.0, False)}
        t.observe(view, now)
    assert t.due(12) is not None


def test_drift_below_the_threshold_does_not_replan_and_above_does():
    t = ReplanTrigger(ReplanPolicy(drift=0.3, period_s=100), now=0)
    t.observe({"a": (100.0, False)}, 0)
    t.planned(0)
    t.observe({"a": (120.0, False)}, 1)
    assert t.due(50) is None
    t.observe({"a": (140.0, False)}, 51)  # 40 % above the last counted figure
    assert t.due(60) is not None and "drifted" in t.due(60)


def test_periodic_replan():
    t = ReplanTrigger(ReplanPolicy(period_s=60), now=0)
    t.observe({"a": (1.0, False)}, 0)
    t.planned(0)
    assert t.due(59) is None and t.due(60) == "periodic"


def test_margin_stops_flapping():
    policy = ReplanPolicy(attainment_margin=0.02, throughput_margin=0.05)
    assert not beats((0.91, 100), (0.90, 100), policy)  # a hair better: keep the current plan
    assert beats((0.93, 100), (0.90, 100), policy)
    assert beats((0.90, 106), (0.90, 100), policy)
    assert not beats((0.85, 200), (0.90, 100), policy)  # more tokens/s but clearly worse attainment


# Moves ---------------------------------------------------------------------------------------


def device(peer: str, flops: float = 1e12) -> Device:
    return Device(peer, "cpu", peer, "r", 1e9, 1e10, flops)


def kinds(*devices: Device) -> dict[str, tuple]:
    return {d.id: kind_of(d) for d in devices}


def placements(ranges: dict[str, tuple[int, int]], tp: int = 1) -> dict[str, Placement]:
    return {peer: Placement(a, b, tp) for peer, (a, b) in ranges.items()}


def test_interchangeable_peers_are_rematched_so_nobody_moves_needlessly():
    current = placements({"a": (0, 4), "b": (4, 8), "c": (0, 4), "d": (4, 8)})
    # The search swapped a with b and c with d: same kinds, so the re-match keeps everyone.
    placed = placements({"a": (4, 8), "b": (0, 4), "c": (4, 8), "d": (0, 4)})
    assigned = rematch(placed, current, kinds(*map(device, "abcd")))
    assert assigned == current and diff(current, assigned) == []


def test_rematch_moves_the_peer_with_the_least_to_load():
    current = placements({"a": (0, 4), "b": (0, 4), "c": (4, 8)})
    placed = placements({"a": (0, 4), "b": (4, 8), "c": (2, 6)})  # one peer must go to 2:6
    assigned = rematch(placed, current, kinds(*map(device, "abc")))
    moves = diff(current, assigned)
    assert sorted(assigned.values()) == sorted(placed.values())
    assert sum(layers_to_load(current[m.peer_id], m.new) for m in moves) == 2


def test_different_kinds_are_not_swapped_and_idle_peers_keep_their_range():
    current = placements({"fast": (0, 4), "slow": (4, 8), "spare": (0, 4)})
    placed = placements({"fast": (4, 8), "slow": (0, 4)})
    assigned = rematch(
        placed, current, kinds(device("fast", 1e13), device("slow", 1e11), device("spare", 1e13))
    )
    # slow keeps the only slot of its kind; fast's slot goes to fast or to spare (same kind, same
    # cost), and whichever of them gets none keeps its range.
    assert assigned["slow"] == (0, 4, 1) and assigned["spare"] in ((0, 4, 1), (4, 8, 1))
    assert len(assigned) == 3


def test_a_degree_change_reloads_the_whole_range_and_counts_as_a_move():
    assert layers_to_load(Placement(0, 4, 1), Placement(2, 6, 1)) == 2
    assert layers_to_load(Placement(0, 4, 1), Placement(0, 4, 2)) == 4  # every shard differs
    # a keeping 0:4 would change its degree (4 layers to load); b taking 0:4 at its own degree
    # loads nothing, and a loads 4:8 at its degree: 4 layers in all instead of 8.
    current = {"a": Placement(0, 4, 1), "b": Placement(0, 4, 2)}
    placed = {"a": Placement(0, 4, 2), "b": Placement(4, 8, 1)}
    assigned = rematch(placed, current, kinds(device("a"), device("b")))
    assert assigned == {"a": Placement(4, 8, 1), "b": Placement(0, 4, 2)}
    assert diff({"a": Placement(0, 4, 1)}, {"a": Placement(0, 4, 2)}) == [
        Move("a", Placement(0, 4, 1), Placement(0, 4, 2))
    ]
    # peers offering other degrees are not interchangeable
    assert kind_of(device("a"), (1, 2)) != kind_of(device("a"), (1, 2, 4))


# Cluster view and planner ---------------------------------------------------------------------


def test_regions_from_labels_and_round_trips():
    records = [
        record("a", 0, 4, region="eu"),
        record("b", 0, 4, links=(("a", 3.0),)),
        record("c", 0, 4, links=(("d", 2.0), ("a", 150.0))),
        record("d", 0, 4),
        record("e", 0, 4),
    ]
    regions = regions_of(records)
    assert regions["a"] == regions["b"] == "eu"
    assert regions["c"] == regions["d"] != "eu"
    assert regions["e"] == "default"


def test_cluster_view_uses_measured_round_trips_and_stated_capacity():
    workload = Workload(slo_scale=100)
    records = [record("a", 0, 4, links=(("b", 8.0),)), record("b", 4, 8, links=(("a", 12.0),))]
    cluster = build_view(records, MODEL, workload)
    assert cluster.latency[0, 1] == pytest.approx(0.005)  # half the mean round trip, in seconds
    assert cluster.devices[0].machine == "a"
    from hexswarm.routing.scheduler.cost_model import max_layers

    assert max_layers(MODEL, 1, cluster.devices[0].memory_bytes, workload.s_in_max + workload.s_out) == 4


def test_compute_plan_covers_the_model_and_leaves_fixed_peers_alone():
    records = [record(f"p{i}", 0, 4) for i in range(4)] + [record("fixed", 0, 2, auto=False)]
    planned = compute_plan(records, MODEL, Workload(slo_scale=100), TINY_SEARCH)
    assert "fixed" not in planned.assignments and len(planned.assignments) == 4
    served = [0] * 8
    for a, b, tp in planned.assignments.values():
        assert b - a <= 4 and tp == 1
        for block in range(a, b):
            served[block] += 1
    assert all(served) and planned.attainment > 0 and planned.plan is not None


GIB = 2**30


def tp_record(peer: str, tp: int, choices: tuple[int, ...], memory: float = 24 * GIB, **kw) -> PeerRecord:
    """A `--tp auto` GPU peer at degree `tp` (its record lists only the ranks serving now)."""
    gpus = tuple(DeviceInfo("cuda", "NVIDIA L4", int(memory), 58) for _ in range(tp))
    base = record(peer, kw.pop("start", 0), kw.pop("end", 4), max_blocks=kw.pop("max_blocks", 0))
    return replace(base, tp=tp, tp_choices=choices, devices=gpus, device="cuda", **kw)


def test_a_tp_auto_peer_is_a_machine_of_k_devices_with_one_ranks_share():
    workload = Workload(slo_scale=100)
    gpu = tp_record("g", 2, (1, 2, 4, 6))
    cpu = replace(record("c", 0, 4, max_blocks=8), tp_choices=(1, 2, 3))
    fixed_degree = replace(record("f", 0, 4), tp=2)
    pinned = replace(tp_record("p", 2, (1, 2)), auto=False)
    gappy = tp_record("x", 2, (2, 4))  # not downward closed (remote input): its degree stays
    cluster = build_view([gpu, cpu, fixed_degree, pinned, gappy], MODEL, workload)
    by_machine: dict[str, list[Device]] = {}
    for d in cluster.devices:
        by_machine.setdefault(d.machine, []).append(d)
    assert [d.id for d in by_machine["g"]] == ["g#0", "g#1", "g#2", "g#3"] == list(device_ids(gpu))
    assert [d.id for d in by_machine["c"]] == ["c#0", "c#1"]
    assert [d.id for d in by_machine["f"]] == ["f"] and [d.id for d in by_machine["p"]] == ["p"]
    assert [d.id for d in by_machine["x"]] == ["x"]
    assert peer_of("g#3") == "g" and peer_of("f") == "f"
    group = build_view([replace(gpu, tp_choices=())], MODEL, workload).devices[0]  # as one device
    rank = by_machine["g"][0]
    assert rank.bandwidth == pytest.approx(group.bandwidth / 2) and rank.flops == pytest.approx(
        group.flops / 2
    )
    assert rank.memory_bytes == pytest.approx(0.9 * 24 * GIB)  # its own GPU's
    assert {d.region for d in by_machine["g"]} == {group.region} and len(
        {d.type for d in by_machine["g"]}
    ) == 1
    # CPU ranks share the machine's memory: the group's (max_blocks' worth) split over K = 2
    whole = build_view([replace(cpu, tp_choices=())], MODEL, workload).devices[0]
    assert by_machine["c"][0].memory_bytes == pytest.approx(whole.memory_bytes / 2)
    assert by_machine["c"][0].flops == pytest.approx(whole.flops)  # measured at tp 1


def test_measured_degrees_give_a_ranks_speed_and_the_all_reduce_it_pays():
    """Two gloo ranks on a CPU: one alone decodes a block in 3.4 ms, both together in 5.6 ms.
    From those figures TP 1 is the faster stage in the cost model (Eq. 4 + Eq. 5); from the
    group's figures alone (one rank = half the group) TP 2 would be."""
    from hexswarm.routing.scheduler.cost_model import comp_cost, tp_comm_cost

    workload = Workload(slo_scale=100)
    measured = ((1, 4000.0, 3.4), (2, 6000.0, 5.6))
    peer = replace(tp_record("g", 2, (1, 2), 64 * GIB, throughput=6000.0), decode_ms_per_block=5.6)

    def decode_s(record: PeerRecord, devices: list[int]) -> float:
        cluster = build_view([record], MODEL, workload)
        args = (cluster, devices, MODEL, 1, 64, 1)
        return comp_cost(*args).decode + tp_comm_cost(*args).decode

    fitted = replace(peer, tp_speeds=measured)
    cluster = build_view([fitted], MODEL, workload)
    assert cluster.latency[0, 1] == pytest.approx((5.6e-3 - 3.4e-3 / 2 - 1 / (2 * 4000)) / 4)
    assert cluster.latency[0, 0] == 0.0
    assert cluster.devices[0].bandwidth == pytest.approx(MODEL.layer_bytes / 3.4e-3)
    assert decode_s(fitted, [0, 1]) == pytest.approx(5.6e-3, rel=0.05)  # the measured TP 2 step
    assert decode_s(fitted, [0]) < decode_s(fitted, [0, 1])
    assert decode_s(peer, [0]) > decode_s(peer, [0, 1])  # unmeasured: ranks add up
    assert build_view([replace(peer, tp_speeds=measured[1:])], MODEL, workload).latency[0, 1] < 1e-4


def test_compute_plan_chooses_the_degree_the_model_needs():
    from hexswarm.routing.scheduler.cost_model import max_layers, stage_memory

    workload = Workload(slo_scale=100)
    tokens = workload.s_in_max + workload.s_out
    memory = (stage_memory(MODEL, 1, 5, tokens) + 1) / 0.9  # one GPU holds 5 of the 8 layers
    assert max_layers(MODEL, 1, 0.9 * memory, tokens) == 5 and max_layers(MODEL, 2, 0.9 * memory, tokens) >= 8
    peer = tp_record("g", 1, (1, 2), memory)  # serves at tp 1 now: only tp 2 holds the model
    planned = compute_plan([peer], MODEL, workload, TINY_SEARCH)
    assert planned.assignments == {"g": Placement(0, 8, 2)} and planned.plan is not None
    assert [s.device_ids for p in planned.plan.pipelines for s in p.stages] == [("g#0", "g#1")]


def test_compute_plan_keeps_the_degree_and_range_of_fixed_peers():
    fixed = replace(record("fixed", 0, 4, auto=False), tp=2, tp_choices=(1, 2))
    fixed_degree = replace(record("a", 0, 4), tp=2)  # auto range, degree fixed at 2
    chooser = replace(record("b", 4, 8, max_blocks=8), tp_choices=(1, 2))
    planned = compute_plan(
        [fixed, fixed_degree, chooser],
        MODEL,
        Workload(slo_scale=100),
        TINY_SEARCH,
    )
    assert set(planned.assignments) == {"a", "b"} and planned.assignments["a"].tp == 2
    assert planned.assignments["b"].tp in (1, 2)
    stages = [s for p in planned.plan.pipelines for s in p.stages if "fixed" in s.device_ids]
    assert stages and all((s.device_ids, s.start, s.end) == (("fixed",), 0, 4) for s in stages)


def test_the_published_plan_carries_the_planned_degrees():
    from hexswarm.swarm.coordinator.service import plan_record

    records = [tp_record("a", 1, (1, 2)), tp_record("b", 2, (1, 2), start=4, end=8)]
    planned = Planned({"b": Placement(4, 8, 1), "a": Placement(0, 4, 2)}, 0.9, 100.0, None)
    published = plan_record("tiny", "C", records, planned, 3)
    assert published.assignments == (Assignment("a", 0, 4, 2), Assignment("b", 4, 8, 1))
    assert PlanRecord.from_bytes(published.to_bytes()).assignments == published.assignments
    # the inputs hash tells records apart by their degree and by the degrees they offer
    other = plan_record("tiny", "C", [replace(records[0], tp_choices=(1,)), records[1]], planned, 3)
    assert other.inputs_hash != published.inputs_hash


SMOL = ModelSpec("smol", 30, 576, 4)  # SmolLM2's shape: 30 layers of hidden 576
CPU_SEARCH = SearchConfig(max_generations=60, time_budget_s=math.inf, stall_generations=30, capacity=False)


def served_blocks(planned: Planned, fixed=(), num_blocks: int = 30) -> list[int]:
    served = [0] * num_blocks
    for a, b in [(p.start, p.end) for p in planned.assignments.values()] + [(r.start, r.end) for r in fixed]:
        for block in range(a, b):
            served[block] += 1
    return served


def test_the_sole_server_of_a_range_leaving_is_covered_again_with_the_default_deadline():
    """A swarm a new user ran: three CPU peers of at most 15 of 30 blocks, the default SLO scale. With
    HexGen's A100 unit every plan scored 0 and the fewest moves won: both survivors stayed on 0:15."""
    peers = [record(name, a, b, max_blocks=15, throughput=20000.0) for name, a, b in
             (("a", 0, 15), ("b", 15, 30), ("c", 0, 15))]  # fmt: skip
    first = compute_plan(peers, SMOL, Workload(), CPU_SEARCH)
    assert first.covers and all(served_blocks(first)) and first.attainment > 0
    survivors = [replace(r, start=first.assignments[r.peer_id].start, end=first.assignments[r.peer_id].end)
                 for r in peers if r.peer_id != "b"]  # fmt: skip
    second = compute_plan(survivors, SMOL, Workload(), CPU_SEARCH, previous=first.plan)
    assert second.covers and all(served_blocks(second)), second.assignments
    assert second.attainment > 0 and second.throughput_tok_s > 0  # the deadline fits the swarm


def test_where_memory_allows_the_plan_serves_every_block_twice():
    """Four peers of at most 15 of 30 blocks: one pipeline of short stages would leave every
    block with one peer; widened within their memory, any one of them may leave."""
    peers = [record(name, 0, 15, max_blocks=15, throughput=20000.0) for name in "abcd"]
    planned = compute_plan(peers, SMOL, Workload(), CPU_SEARCH)
    assert min(served_blocks(planned)) >= 2, planned.assignments
    assert all(b - a <= 15 for a, b, _ in planned.assignments.values())


def test_no_covering_plan_names_the_missing_blocks_and_the_memory_short():
    peers = [record("a", 0, 10, max_blocks=10), record("b", 10, 20, max_blocks=10)]
    planned = compute_plan(peers, SMOL, Workload(), CPU_SEARCH)
    assert len(planned.missing) == 10 and planned.memory_short_blocks == 10
    assert sum(1 for n in served_blocks(planned) if n) == 20  # still as much as the peers can hold


def test_a_plan_that_covers_replaces_one_that_does_not_whatever_the_estimates():
    from hexswarm.swarm.coordinator.service import plan_record

    peers = [record("a", 0, 15, max_blocks=15), record("b", 0, 15, max_blocks=15)]
    planned = compute_plan(peers, SMOL, Workload(), CPU_SEARCH)
    published = plan_record("m", "A", peers, planned, 1)
    assert published.missing == () and PlanRecord.from_bytes(published.to_bytes()) == published
    broken = replace(published, missing=(3, 4), memory_short_blocks=2)
    assert PlanRecord.from_bytes(broken.to_bytes()).missing == (3, 4)


def test_the_swarm_deadline_unit_is_the_fastest_peer_alone():
    from hexswarm.routing.scheduler.cost_model import swarm_reference_latency
    from hexswarm.routing.scheduler.simulation.simulator import make_trace

    cluster = build_view([record("slow", 0, 4, throughput=1000.0), record("fast", 4, 8, throughput=8000.0)],
                         MODEL, Workload())  # fmt: skip
    unit = swarm_reference_latency(cluster, MODEL, 128.0, 32)
    alone = [swarm_reference_latency(cluster.subset([d.id]), MODEL, 128.0, 32) for d in cluster.devices]
    assert unit == min(alone) < max(alone)
    assert make_trace(MODEL, Workload(slo_scale=3, reference_s=unit)).deadline_s == pytest.approx(3 * unit)
    with pytest.raises(ValueError):
        Workload(reference_s=-1.0)


def test_petals_fallback_places_auto_peers_around_fixed_ones():
    fixed = [record("f", 0, 4, auto=False)]
    placed = petals_placement([record("a", 0, 4)], fixed, 8)
    assert placed == {"a": Placement(4, 8, 1)}
    # each keeps its current degree
    assert petals_placement([replace(record("a", 0, 4), tp=2)], fixed, 8) == {"a": Placement(4, 8, 2)}


# Peer side: joining, Petals' fallback, safe moves ---------------------------------------------------


def test_peer_side_rules():
    from hexswarm.peer.plan_follower import fallback_target, initial_range, old_range_covered

    others = [record("a", 0, 4), record("b", 0, 4)]
    assert initial_range(others, 8, 4) == (4, 8)
    me = record("c", 0, 4)
    assert fallback_target([*others, me], me, 8, __import__("random").Random(0)) == (4, 8)
    assert old_range_covered([*others, me], "c", (0, 4), (4, 8))
    assert not old_range_covered([record("a", 0, 2), me], "c", (0, 4), (4, 8))
    assert old_range_covered([record("a", 0, 2), me], "c", (0, 4), (2, 6))


def test_two_peers_swapping_ranges_do_not_wait_for_each_other():
    from hexswarm.peer.plan_follower import goes_first_in_a_swap

    # a moves 15:30 -> 0:15 while b moves 0:15 -> 15:30: each holds the other's new blocks.
    a = replace(record("a", 15, 30, max_blocks=15), next_start=0, next_end=15)
    b = replace(record("b", 0, 15, max_blocks=15), next_start=15, next_end=30)
    assert goes_first_in_a_swap([a, b], "a", (15, 30), (0, 15))
    assert not goes_first_in_a_swap([a, b], "b", (0, 15), (15, 30))  # it waits for a to switch
    # a peer that loads our old blocks but does not wait for us is left to finish loading
    c = replace(record("c", 0, 15, max_blocks=15), next_start=15, next_end=30)
    assert not goes_first_in_a_swap([a, c, record("d", 0, 15)], "a", (15, 30), (0, 10))
    assert not goes_first_in_a_swap([a, record("b", 0, 15)], "a", (15, 30), (0, 15))  # nobody loads them


def test_the_coordinator_plans_from_where_peers_are_going():
    from hexswarm.swarm.coordinator.service import where_bound

    moving = replace(record("a", 15, 30), next_start=10, next_end=25)
    behind = replace(record("b", 15, 30), plan_version=1)
    fixed = record("f", 0, 2, auto=False)
    published = plan(2, assignments=(("b", 0, 15), ("f", 5, 6)))
    bound = {r.peer_id: (r.start, r.end) for r in where_bound([moving, behind, fixed], published)}
    assert bound == {"a": (10, 25), "b": (0, 15), "f": (0, 2)}
    assert where_bound([behind], None) == [behind]


def test_follower_takes_only_newer_plans_of_the_holder():
    import asyncio

    from hexswarm.peer.plan_follower import PlanFollower
    from hexswarm.swarm.coordinator.records import Coordination

    moves = []

    async def move(start: int, end: int, tp: int | None = None) -> None:  # tp: the peer side's newer call
        moves.append((start, end))

    follower = PlanFollower(None, "p1", "m", 8, move, rebalance_period=60)
    me = record("p1", 0, 4)
    holder = Lease("m", "A", 1.0)

    def follow(p: PlanRecord) -> None:
        asyncio.run(follower._follow(Coordination(holder, p, p.version), me))

    follow(plan(2, assignments=(("p1", 4, 8),)))
    assert moves == [(4, 8)] and follower.followed == 2
    follow(plan(1, assignments=(("p1", 2, 6),)))  # stale: ignored
    follow(plan(2, assignments=(("p1", 2, 6),)))  # same version: ignored
    assert moves == [(4, 8)]
    follow(plan(3, assignments=(("p1", 0, 4),)))  # newer, and p1 already serves 0:4: no move
    assert moves == [(4, 8)] and follower.followed == 3


def test_follower_takes_the_planned_degree_only_from_the_choices_it_offers():
    import asyncio
    from dataclasses import replace

    from hexswarm.peer.plan_follower import PlanFollower
    from hexswarm.swarm.coordinator.records import Coordination

    moves = []

    async def move(start: int, end: int, tp: int | None = None) -> None:
        moves.append((start, end, tp))

    follower = PlanFollower(None, "p1", "m", 8, move, rebalance_period=60)
    holder = Lease("m", "A", 1.0)
    gpu = DeviceInfo("cuda", "NVIDIA A100", 80 << 30, 108)
    offers = replace(record("p1", 0, 4), tp=2, devices=(gpu, gpu), tp_choices=(1, 2, 4))
    fixed_degree = replace(offers, tp_choices=())

    def follow(p: PlanRecord, me: PeerRecord) -> None:
        asyncio.run(follower._follow(Coordination(holder, p, p.version), me))

    follow(plan(1, assignments=(("p1", 0, 4, 4),)), offers)  # same range, another degree: a move
    follow(plan(2, assignments=(("p1", 0, 4, 2),)), offers)  # what it serves: no move
    follow(plan(3, assignments=(("p1", 4, 8, 8),)), offers)  # a degree it does not offer: keeps 2
    follow(plan(4, assignments=(("p1", 0, 4, 1),)), fixed_degree)  # it offers none: nothing to do
    assert moves == [(0, 4, 4), (4, 8, 2)]


def test_a_plan_for_throughput_says_so_and_old_records_read_as_slo():
    import msgpack

    from hexswarm.swarm.coordinator.service import plan_record

    records = [record(f"p{i}", 0, 4) for i in range(4)]
    workload = Workload(slo_scale=100, objective="throughput")
    planned = compute_plan(records, MODEL, workload, TINY_SEARCH)
    # no request is late without a deadline: plans are told apart by tokens/s (`beats`)
    assert planned.plan.estimate.objective == "throughput" and planned.attainment == 1.0
    assert planned.throughput_tok_s > 0
    published = plan_record("tiny", "C", records, planned, 1, workload.objective)
    assert PlanRecord.from_bytes(published.to_bytes()).objective == "throughput"
    old = published.to_dict()
    del old["objective"]  # a record of an earlier version
    assert PlanRecord.from_bytes(msgpack.packb(old)).objective == "slo"
    old["objective"] = "fastest"
    with pytest.raises(CoordinationRecordError):
        PlanRecord.from_bytes(msgpack.packb(old))


def test_coordinator_flags_choose_the_objective(make_model):
    import argparse

    from hexswarm.swarm.coordinator.command import add_arguments, coordinator_config

    model_dir = make_model()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    base = [
        "--initial-peers",
        "/ip4/127.0.0.1/tcp/1/p2p/QmUMM67xgzV8V4puwGSHTmS7U3VxVutYhVZPYoexxBz82Q",
        "--model",
        str(model_dir),
    ]
    assert coordinator_config(parser.parse_args(base), str(model_dir)).workload.objective == "slo"
    args = parser.parse_args(base + ["--objective", "throughput"])
    assert not coordinator_config(args, str(model_dir)).workload.has_deadline


def test_status_names_the_objective(capsys):
    from hexswarm.client.status import print_plan
    from hexswarm.swarm.coordinator.records import Coordination

    for objective, words in (("slo", "estimated attainment 90.0%"), ("throughput", "planned for throughput")):
        record_ = replace(plan(2), objective=objective)
        print_plan(Coordination(Lease("m", "A", 1.0), record_, 2), [record("p1", 0, 4)])
        assert words in capsys.readouterr().out


def test_status_says_loudly_when_no_plan_covers_the_model(capsys):
    from hexswarm.client.status import print_plan
    from hexswarm.swarm.coordinator.records import Coordination

    uncovered = replace(plan(2), missing=(20, 21, 22, 29), memory_short_blocks=4)
    print_plan(Coordination(Lease("m", "A", 1.0), uncovered, 2), [record("p1", 0, 4)])
    out = capsys.readouterr().out
    assert "NO PLAN COVERS THE MODEL: blocks 20:23, 29:30 have no peer" in out
    assert "the peers can hold 4 blocks too few between them" in out
