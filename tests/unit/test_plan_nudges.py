"""Nudges that tell auto peers a new plan is out (swarm/coordinator/nudges.py): what counts,
from whom, and how often they can make a peer read."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgpack
import pytest

from hexswarm.swarm.coordinator import nudges
from hexswarm.swarm.coordinator.nudges import MAX_PLAN_VERSION, Nudge, NudgeInbox, send_nudges
from hexswarm.swarm.wire.frames import framed


class Pipe:
    """One stream's two ends, as a binary stream handler and its caller see them."""

    def __init__(self):
        self.to_peer = asyncio.StreamReader()
        self.to_sender = asyncio.StreamReader()
        self.peer_writer = _Writer(self.to_sender)
        self.sender_writer = _Writer(self.to_peer)


class _Writer:
    def __init__(self, into: asyncio.StreamReader):
        self.into = into

    def write(self, data: bytes) -> None:
        self.into.feed_data(data)

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.into.feed_eof()


def test_a_nudge_is_exactly_a_model_and_a_version_in_range():
    assert Nudge.from_bytes(Nudge("m", 7).to_bytes()) == Nudge("m", 7)
    for bad in (
        b"\xc1",
        msgpack.packb([1, 2]),
        msgpack.packb({"model": "m"}),
        msgpack.packb({"model": "m", "version": 1, "plan": "x"}),
        msgpack.packb({"model": "", "version": 1}),
        msgpack.packb({"model": "m", "version": 0}),
        msgpack.packb({"model": "m", "version": MAX_PLAN_VERSION + 1}),
        msgpack.packb({"model": "m", "version": 1.0}),
        msgpack.packb({"model": "m", "version": True}),
    ):
        with pytest.raises(ValueError):
            Nudge.from_bytes(bad)


def deliver(inbox: NudgeInbox, sender: str, payload: bytes) -> bytes:
    """What the inbox answers to `payload` sent by `sender`."""

    async def run() -> bytes:
        pipe = Pipe()
        pipe.sender_writer.write(payload)
        await inbox.handle_stream(SimpleNamespace(peer_id=sender), pipe.to_peer, pipe.peer_writer)
        return await pipe.to_sender.read()

    return asyncio.run(run())


def test_only_a_trusted_coordinators_nudge_for_this_model_and_a_newer_plan_counts():
    inbox = NudgeInbox("m", frozenset({"coordinator"}), followed=lambda: 4)
    assert deliver(inbox, "stranger", framed(Nudge("m", 5).to_bytes())) == b""  # closed unread
    assert deliver(inbox, "coordinator", framed(Nudge("other", 5).to_bytes())) == nudges.RECEIVED
    assert deliver(inbox, "coordinator", framed(Nudge("m", 4).to_bytes())) == nudges.RECEIVED
    assert not inbox.arrived.is_set()
    assert deliver(inbox, "coordinator", framed(b"\x00" * 2000)) == b""  # over the size limit
    assert deliver(inbox, "coordinator", framed(Nudge("m", 5).to_bytes())) == nudges.RECEIVED
    assert inbox.arrived.is_set()


def test_a_private_swarm_takes_nudges_from_any_member():
    inbox = NudgeInbox("m", None, followed=lambda: 0)
    deliver(inbox, "member", framed(Nudge("m", 1).to_bytes()))
    assert inbox.arrived.is_set()


def test_nudges_make_a_peer_read_at_most_once_a_gap(monkeypatch):
    monkeypatch.setattr(nudges, "NUDGE_READ_GAP_S", 0.2)

    async def run() -> list[float]:
        inbox, stop, reads = NudgeInbox("m", None, followed=lambda: 0), asyncio.Event(), []
        loop = asyncio.get_running_loop()

        async def flood() -> None:
            for _ in range(50):
                inbox.take_local(Nudge("m", 1))
                await asyncio.sleep(0.01)
            stop.set()

        flooding = asyncio.create_task(flood())
        while await inbox.wait(stop):
            reads.append(loop.time())
        await flooding
        return reads

    reads = asyncio.run(run())
    assert len(reads) >= 2  # 50 nudges over 0.5 s or more: one read a gap, not 50
    assert all(b - a >= 0.19 for a, b in zip(reads, reads[1:], strict=False))


def test_the_coordinator_counts_the_peers_that_received_its_nudge():
    async def run() -> tuple[int, list[bool]]:
        inbox = NudgeInbox("m", None, followed=lambda: 0)

        async def open_stream(peer_id: str, protocol: str):
            assert protocol == nudges.NUDGE_PROTOCOL
            if peer_id == "unreachable":
                raise ConnectionError("no route")
            pipe = Pipe()
            asyncio.create_task(
                inbox.handle_stream(SimpleNamespace(peer_id="c"), pipe.to_peer, pipe.peer_writer)
            )
            return pipe.to_sender, pipe.sender_writer

        told = await send_nudges(open_stream, ["a", "unreachable", "b"], Nudge("m", 3))
        return told, [inbox.arrived.is_set()]

    assert asyncio.run(run()) == (2, [True])
