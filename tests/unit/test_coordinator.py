"""The coordinator's pure logic: records and signatures, debounce, margin, moves, versions, cluster view."""

from __future__ import annotations

import pytest

from routing.scheduler.cluster import Device
from routing.scheduler.genetic import SearchConfig
from routing.scheduler.model_spec import ModelSpec, Workload
from swarm.coordinator.cluster_view import build_view, regions_of
from swarm.coordinator.moves import diff, layers_to_load, rematch
from swarm.coordinator.planner import compute_plan, petals_placement
from swarm.coordinator.records import (
    Assignment,
    CoordinationRecordError,
    Lease,
    PlanRecord,
    coordination_from,
    current_holder,
    plans_from,
)
from swarm.coordinator.triggers import ReplanPolicy, ReplanTrigger, beats
from swarm.records import DeviceInfo, PeerRecord, PeerState

MODEL = ModelSpec("tiny", 8, 128, 4)


def record(peer: str, start: int, end: int, auto: bool = True, max_blocks: int = 4, **kw) -> PeerRecord:
    fields = dict(throughput=5000.0, region="", rtt_ms=())
    fields.update(kw)
    return PeerRecord(
        peer, peer, "tiny", start, end, PeerState.ONLINE, fields["throughput"], 0.5, 1000, 0, 2048,
        "float32", "cpu", "0", devices=(DeviceInfo("cpu", "cpu", 16 * 2**30, 2),), auto=auto,
        max_blocks=max_blocks, region=fields["region"], rtt_ms=fields["rtt_ms"],
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


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b.update(schema=2),
        lambda b: b.update(version=0),
        lambda b: b.update(version=True),
        lambda b: b.update(assignments=[["p1", 4, 2, 1]]),
        lambda b: b.update(assignments=[["p1", 0, 4, 1], ["p1", 4, 8, 1]]),
        lambda b: b.update(attainment="high"),
    ],
)
def test_malformed_plans_are_refused(mutate):
    import msgpack

    body = plan(1).to_dict()
    mutate(body)
    with pytest.raises(CoordinationRecordError):
        PlanRecord.from_bytes(msgpack.packb(body))


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
    r = record("p", 0, 4, rtt_ms=(("q", 1.5),), region="eu")
    back = PeerRecord.from_bytes(r.to_bytes())
    assert back == r and back.rtt_ms == (("q", 1.5),)


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


def test_interchangeable_peers_are_rematched_so_nobody_moves_needlessly():
    current = {"a": (0, 4), "b": (4, 8), "c": (0, 4), "d": (4, 8)}
    # The search swapped a with b and c with d: same kinds, so the re-match keeps everyone.
    placed = {"a": (4, 8), "b": (0, 4), "c": (4, 8), "d": (0, 4)}
    assigned = rematch(placed, current, [device(p) for p in "abcd"])
    assert assigned == current and diff(current, assigned) == []


def test_rematch_moves_the_peer_with_the_least_to_load():
    current = {"a": (0, 4), "b": (0, 4), "c": (4, 8)}
    placed = {"a": (0, 4), "b": (4, 8), "c": (2, 6)}  # one peer must go to 2:6
    assigned = rematch(placed, current, [device(p) for p in "abc"])
    moves = diff(current, assigned)
    assert sorted(assigned.values()) == sorted(placed.values())
    assert sum(layers_to_load(current[m.peer_id], m.new) for m in moves) == 2


def test_different_kinds_are_not_swapped_and_idle_peers_keep_their_range():
    current = {"fast": (0, 4), "slow": (4, 8), "spare": (0, 4)}
    placed = {"fast": (4, 8), "slow": (0, 4)}
    devices = [device("fast", 1e13), device("slow", 1e11), device("spare", 1e13)]
    assigned = rematch(placed, current, devices)
    # slow keeps the only slot of its kind; fast's slot goes to fast or to spare (same kind, same
    # cost), and whichever of them gets none keeps its range.
    assert assigned["slow"] == (0, 4) and assigned["spare"] in ((0, 4), (4, 8))
    assert len(assigned) == 3


# Cluster view and planner ---------------------------------------------------------------------


def test_regions_from_labels_and_round_trips():
    records = [
        record("a", 0, 4, region="eu"),
        record("b", 0, 4, rtt_ms=(("a", 3.0),)),
        record("c", 0, 4, rtt_ms=(("d", 2.0), ("a", 150.0))),
        record("d", 0, 4),
        record("e", 0, 4),
    ]
    regions = regions_of(records)
    assert regions["a"] == regions["b"] == "eu"
    assert regions["c"] == regions["d"] != "eu"
    assert regions["e"] == "default"


def test_cluster_view_uses_measured_round_trips_and_stated_capacity():
    workload = Workload(slo_scale=100)
    records = [record("a", 0, 4, rtt_ms=(("b", 8.0),)), record("b", 4, 8, rtt_ms=(("a", 12.0),))]
    cluster = build_view(records, MODEL, workload)
    assert cluster.latency[0, 1] == pytest.approx(0.005)  # half the mean round trip, in seconds
    assert cluster.devices[0].machine == "a"
    from routing.scheduler.cost_model import max_layers

    assert max_layers(MODEL, 1, cluster.devices[0].memory_bytes, workload.s_in_max + workload.s_out) == 4


def test_compute_plan_covers_the_model_and_leaves_fixed_peers_alone():
    records = [record(f"p{i}", 0, 4) for i in range(4)] + [record("fixed", 0, 2, auto=False)]
    planned = compute_plan(
        records, MODEL, Workload(slo_scale=100), SearchConfig(time_budget_s=1, capacity=False)
    )
    assert "fixed" not in planned.assignments and len(planned.assignments) == 4
    served = [0] * 8
    for a, b in planned.assignments.values():
        assert b - a <= 4
        for block in range(a, b):
            served[block] += 1
    assert all(served) and planned.attainment > 0 and planned.plan is not None


def test_petals_fallback_places_auto_peers_around_fixed_ones():
    fixed = [record("f", 0, 4, auto=False)]
    placed = petals_placement([record("a", 0, 4)], fixed, 8)
    assert placed == {"a": (4, 8)}


# Peer side: joining, Petals' fallback, safe moves ---------------------------------------------------


def test_peer_side_rules():
    from peer.link_probe import tcp_endpoint
    from peer.plan_follower import fallback_target, initial_range, old_range_covered

    others = [record("a", 0, 4), record("b", 0, 4)]
    assert initial_range(others, 8, 4) == (4, 8)
    me = record("c", 0, 4)
    assert fallback_target([*others, me], me, 8, __import__("random").Random(0)) == (4, 8)
    assert old_range_covered([*others, me], "c", (0, 4), (4, 8))
    assert not old_range_covered([record("a", 0, 2), me], "c", (0, 4), (4, 8))
    assert old_range_covered([record("a", 0, 2), me], "c", (0, 4), (2, 6))
    assert tcp_endpoint("/ip4/127.0.0.1/tcp/4242/p2p/Qm") == ("127.0.0.1", 4242)
    assert tcp_endpoint("/ip4/127.0.0.1/udp/4242/quic") is None


def test_follower_takes_only_newer_plans_of_the_holder():
    import asyncio

    from peer.plan_follower import PlanFollower
    from swarm.coordinator.records import Coordination

    moves = []

    async def move(start: int, end: int) -> None:
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
