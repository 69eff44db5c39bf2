"""Whose lease and plans count: the trusted coordinator keys, and bounded plan versions."""

import asyncio

import msgpack
import pytest

from hexswarm.peer.plan_follower import PlanFollower
from hexswarm.swarm.coordinator.records import (
    MAX_PLAN_VERSION,
    Assignment,
    Coordination,
    CoordinationRecordError,
    Lease,
    PlanRecord,
    coordination_from,
    trust_from,
    trusted_only,
)
from hexswarm.swarm.net.identity import load_or_create_identity
from tests.unit.record_cases import make_record


def plan(version: int, coordinator: str, *assignments: tuple[str, int, int]) -> PlanRecord:
    moves = tuple(Assignment(peer, start, end) for peer, start, end in assignments)
    return PlanRecord("m", version, coordinator, "h", 1.0, 10.0, moves)


def test_no_key_named_trusts_any_member_of_a_private_swarm_and_nobody_in_the_public_one():
    key = load_or_create_identity(None).peer_id.to_base58()
    assert trust_from(None, public=False) is None
    assert trust_from(None, public=True) == frozenset()
    assert trust_from([key], public=True) == frozenset({key})
    with pytest.raises(ValueError, match="not a peer id"):
        trust_from(["not-a-key!"], public=False)


def test_a_claim_from_the_beginning_of_time_wins_only_among_trusted_keys():
    honest, stranger = Lease("m", "A", 100.0), Lease("m", "X", 0.0)
    claims = [("A", honest), ("X", stranger)]
    assert coordination_from(claims, [], "m").holder == stranger  # what a since-ranked lease allowed
    assert coordination_from(trusted_only(claims, frozenset({"A"}), "lease"), [], "m").holder == honest
    assert trusted_only(claims, frozenset(), "lease") == []  # the public swarm's default
    assert trusted_only(claims, None, "lease") == claims


def test_plan_versions_and_lease_times_are_bounded():
    body = msgpack.unpackb(plan(1, "A").to_bytes())
    body["version"] = MAX_PLAN_VERSION + 1
    with pytest.raises(CoordinationRecordError, match="version"):
        PlanRecord.from_bytes(msgpack.packb(body))
    assert PlanRecord.from_bytes(plan(MAX_PLAN_VERSION, "A").to_bytes()).version == MAX_PLAN_VERSION
    for since in (-1.0, float("nan"), 1e13):
        lease = msgpack.unpackb(Lease("m", "A", 1.0).to_bytes())
        lease["since"] = since
        with pytest.raises(CoordinationRecordError):
            Lease.from_bytes(msgpack.packb(lease))


def test_a_new_holder_is_followed_even_if_it_numbers_its_plans_lower():
    moves = []

    async def move(start: int, end: int, tp: int | None = None) -> None:
        moves.append((start, end))

    follower = PlanFollower(None, "p1", "m", 8, move, rebalance_period=60)
    me = make_record(peer_id="p1", model_id="m", start=0, end=4)

    def follow(holder: str, p: PlanRecord) -> None:
        asyncio.run(follower._follow(Coordination(Lease("m", holder, 1.0), p, p.version), me))

    follow("A", plan(1000, "A", ("p1", 4, 8)))
    follow("A", plan(999, "A", ("p1", 2, 6)))  # the same holder's older plan: ignored
    follow("B", plan(3, "B", ("p1", 0, 4)))  # a new holder: followed (p1 already serves 0:4)
    follow("B", plan(4, "B", ("p1", 2, 6)))
    assert moves == [(4, 8), (2, 6)] and (follower.followed, follower.followed_from) == (4, "B")


def test_a_follower_that_trusts_no_coordinator_never_reads_the_plan(monkeypatch):
    """Its Petals rule still runs each period, without reading the lease or plan keys."""
    import hexswarm.peer.plan_follower as plan_follower

    found: list[str] = []

    async def read(dht, model_id, trust, every_node=True):
        found.append(model_id)
        return Coordination(None, None, 0)

    async def move(start: int, end: int, tp: int | None = None) -> None:
        pass

    monkeypatch.setattr(plan_follower, "read_coordination", read)
    public = PlanFollower(None, "p1", "m", 8, move, rebalance_period=60, trust=frozenset())
    me = make_record(peer_id="p1", model_id="m", start=0, end=4)
    assert public.trusts_none
    asyncio.run(public.step([me], me, now=0.0))
    assert not asyncio.run(public.follow_newer(me)) and found == []


def test_a_follower_reads_the_plan_every_few_periods_and_before_petals_rule(monkeypatch):
    """Nudges bring new plans; the period's read catches a lost one, and a lease gone before
    Petals' rule may move the peer (peer/plan_follower.py `step`)."""
    import hexswarm.peer.plan_follower as plan_follower

    reads: list[int] = []

    async def read(dht, model_id, trust, every_node=True):
        reads.append(step)
        return Coordination(Lease("m", "A", 1.0), None, 0)

    async def move(start: int, end: int, tp: int | None = None) -> None:
        pass

    monkeypatch.setattr(plan_follower, "read_coordination", read)
    follower = PlanFollower(None, "p1", "m", 8, move, rebalance_period=60)
    me = make_record(peer_id="p1", model_id="m", start=0, end=4)
    follower.next_check = 1000.0  # Petals' rule not due
    for step in range(1, 10):
        asyncio.run(follower.step([me], me, now=float(step)))
    assert reads == [1, 1 + plan_follower.PLAN_READ_PERIODS, 1 + 2 * plan_follower.PLAN_READ_PERIODS]
    step = 10
    asyncio.run(follower.step([me], me, now=1000.0))  # the rule is due: the lease is read first
    assert reads[-1] == 10
