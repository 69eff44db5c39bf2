"""The parts of a session's failover, each alone, on fakes (no peers, no network): which hops
take pushes (client/push_relay.py) and a span's repair (client/span_repair.py)."""

from __future__ import annotations

import asyncio
import random

import torch

from hexswarm.client.hop_links import LiveHop
from hexswarm.client.known_peers import KnownPeers
from hexswarm.client.peer_failures import PeerFailures
from hexswarm.client.push_relay import PushPlan
from hexswarm.client.remote import PeerError
from hexswarm.client.retry import BanList, RetryPolicy
from hexswarm.client.span_repair import Replacement, SpanRepair
from hexswarm.routing.chains.swarm_view import Hop, Route
from hexswarm.swarm.wire.protocol import ErrorCode


class _Conn:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _hop(peer: str, start: int, end: int, upstream: str = "") -> LiveHop:
    return LiveHop(Hop(peer, start, end), _Conn(), f"s-{peer}", upstream)


def _chain() -> list[LiveHop]:
    return [_hop("a", 0, 2), _hop("b", 2, 4, "a"), _hop("c", 4, 6, "b")]


def test_a_step_is_pushed_along_hops_that_take_pushes_from_the_one_before():
    hops = _chain()
    assert PushPlan(push=True).segment_end(hops, 0) == 3
    assert PushPlan(push=False).segment_end(hops, 0) == 1
    hops[2].upstream = ""  # opened next to a repaired span: it takes pushes from no one
    assert PushPlan(push=True).segment_end(hops, 0) == 2


def _steps_relayed(plan: PushPlan, hops: list[LiveHop], cap: int = 1000) -> int | None:
    """Steps, from the next one, until a's step is pushed on through b and c again."""
    for steps in range(1, cap + 1):
        plan.next_step()
        if plan.segment_end(hops, 0) == 3:
            return steps
    return None


def test_a_failed_push_relays_that_hop_for_a_while_then_tries_again():
    hops, plan = _chain(), PushPlan(push=True)
    plan.next_step()
    plan.sent(0, 3)
    assert plan.push_failed(hops, 0, 3) == 4  # a could not push to b: b and c got nothing pushed
    assert plan.hop_steps == {"sent": 1, "pushed": 0, "push_failed": 1}
    assert plan.segment_end(hops, 0) == 1 and plan.segment_end(hops, 1) == 3
    assert _steps_relayed(plan, hops) == 4
    # each failure in a row doubles the wait, up to 256 steps
    assert [plan.push_failed(hops, 0, 3) for _ in range(8)] == [8, 16, 32, 64, 128, 256, 256, 256]
    assert _steps_relayed(plan, hops) == 256
    plan.pushed_into(hops[1])  # a push went through: the next failure starts the count again
    assert plan.push_failed(hops, 0, 3) == 4


def test_a_peer_that_pushed_something_else_is_never_pushed_from_again():
    hops, plan = _chain(), PushPlan(push=True)
    plan.distrust("b")  # b pushed something else than it returned
    assert plan.segment_end(hops, 0) == 2 and plan.segment_end(hops, 1) == 2
    assert _steps_relayed(plan, hops) is None


class _Swarm:
    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget(self, peer_id: str) -> None:
        self.forgotten.append(peer_id)


class _Chooser:
    """Offers `routes` in turn."""

    def __init__(self, routes: list[Route]):
        self.routes = routes

    async def route(self, start: int, end: int, formats) -> Route:
        return self.routes.pop(0)

    def no_route_past_deadline(self) -> bool:
        return False


class _Links:
    """Opens hops on fake connections; a hop on a peer in `dead` fails its first step. Each hop
    adds its end to the hidden states (so the output says which hops it went through)."""

    def __init__(self, dead: set[str]):
        self.dead, self.steps = dead, []

    async def open(self, route: Route, upstream: str, pipelined: bool = False) -> list[LiveHop]:
        hops, previous = [], upstream
        for hop in route.hops:
            hops.append(_hop(hop.peer_id, hop.start, hop.end, previous))
            previous = hop.peer_id
        return hops

    async def run(self, hop: LiveHop, hidden: torch.Tensor, position: int) -> torch.Tensor:
        if hop.peer_id in self.dead:
            raise PeerError(hop.peer_id, ErrorCode.PEER_FAILED, "gone", peer_id=hop.peer_id)
        self.steps.append((hop.peer_id, position, hidden.shape[1]))
        return hidden + hop.end

    @staticmethod
    def drop(hops: list[LiveHop]) -> None:
        for hop in hops:
            hop.conn.close()


def _route(*hops: tuple[str, int, int]) -> Route:
    return Route(tuple(Hop(*h) for h in hops), 0.0, 0.0)


def test_a_repair_bans_the_peer_that_failed_the_replay_and_replays_onto_another_chain():
    policy = RetryPolicy(backoff_base_s=0.0, backoff_max_s=0.0)
    swarm = _Swarm()
    failures = PeerFailures(swarm, KnownPeers(swarm, None, 16), policy, BanList(policy))
    links = _Links(dead={"x"})
    chooser = _Chooser([_route(("b", 2, 4), ("x", 4, 6)), _route(("b", 2, 3), ("c", 3, 6))])
    repair = SpanRepair(chooser, links, failures, random.Random(0))
    inputs = torch.zeros(1, 5, 2)

    got = asyncio.run(repair.replace(2, 6, inputs, upstream="a"))

    assert isinstance(got, Replacement)
    assert [(h.peer_id, h.start, h.end, h.upstream) for h in got.hops] == [("b", 2, 3, "a"), ("c", 3, 6, "b")]
    assert set(got.seen) == {2, 3} and torch.equal(got.seen[3], inputs + 3)
    assert torch.equal(got.output, inputs + 3 + 6)
    assert failures.failed_here == {"x"} and "x" in failures.bans.banned() and swarm.forgotten == ["x"]
    assert failures.budget.used == 1


def test_opening_replays_nothing():
    policy = RetryPolicy()
    swarm = _Swarm()
    failures = PeerFailures(swarm, KnownPeers(swarm, None, 16), policy, BanList(policy))
    links = _Links(dead=set())
    got = asyncio.run(SpanRepair(_Chooser([_route(("a", 0, 6))]), links, failures).replace(0, 6, None))
    assert [h.peer_id for h in got.hops] == ["a"] and got.seen == {} and got.output is None
    assert links.steps == [] and failures.budget.used == 0
