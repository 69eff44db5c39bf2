"""A relayed peer has each relay slot dialed through once, not every announce period
(peer/reachability.py `Reachability._verified`): the slot's own stream says when it is gone."""

from __future__ import annotations

import asyncio

from hexswarm.peer import reachability
from hexswarm.peer.reachability import SLOT_REVERIFY_S, Reachability
from hexswarm.swarm.nat.port_relay import Slot
from hexswarm.swarm.nat.reachability.messages import DialBackReply

ME = "QmMe"


def checked(monkeypatch, answers: dict[str, bool]) -> list[str]:
    """Relays asked to dial through their slot; each answers as `answers` says (absent: no answer)."""
    asked: list[str] = []

    async def ask(p2p, relay_id: str, addrs: list[str]):
        asked.append(relay_id)
        if relay_id not in answers:
            return None
        return DialBackReply(relay_id, ((addrs[0], addrs[0]),) if answers[relay_id] else ())

    monkeypatch.setattr(reachability, "ask", ask)
    return asked


def peer_with_slots(*relays: str) -> Reachability:
    check = Reachability(ME, "relayed", 0.0, restart_dht=None)
    for i, relay in enumerate(relays):
        check.slots[relay] = Slot(relay, "10.0.0.1", 4000 + i, 5000 + i)
    return check


def test_a_slot_that_worked_is_not_dialed_again_each_period(monkeypatch):
    asked = checked(monkeypatch, {"r1": True, "r2": True})
    check = peer_with_slots("r1", "r2")
    first = asyncio.run(check._verified())
    assert len(first) == 2 and sorted(asked) == ["r1", "r2"]
    for _ in range(5):
        assert asyncio.run(check._verified()) == first
    assert len(asked) == 2


def test_a_new_or_failed_slot_is_dialed_and_a_working_one_again_after_a_while(monkeypatch):
    asked = checked(monkeypatch, {"r1": True, "r2": False})
    check = peer_with_slots("r1", "r2")
    assert len(asyncio.run(check._verified())) == 1
    asyncio.run(check._verified())
    assert asked == ["r1", "r2", "r2"]  # the one that failed is asked again, each period
    check.slots["r3"] = Slot("r3", "10.0.0.2", 4100, 5100)
    asyncio.run(check._verified())
    assert asked[-2:] == ["r2", "r3"]
    check.verified = {addr: at - SLOT_REVERIFY_S for addr, at in check.verified.items()}
    asked.clear()
    asyncio.run(check._verified())
    assert "r1" in asked


def test_no_answer_and_nothing_verified_is_no_news(monkeypatch):
    checked(monkeypatch, {})
    assert asyncio.run(peer_with_slots("r1")._verified()) is None
