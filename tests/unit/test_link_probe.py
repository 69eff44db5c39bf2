"""LinkProbe: round trips measured by PING over a stream to a peer id, never by a connection to an
announced address; a bounded sample per step, each probe with a deadline.

The peers are loopback TCP servers answering PING with PONG (the stream `connect` opens stands
for the p2p stream to that peer id). A hostile record's `addrs` name another listener, which
counts the connections it gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

import hexswarm.peer.link_probe as link_probe
from hexswarm.peer.link_probe import LinkProbe
from hexswarm.swarm.trust.records import PeerState, link_tag
from hexswarm.swarm.wire.frames import read_frame, write_frame
from hexswarm.swarm.wire.protocol import Error, ErrorCode, Ping, Pong
from tests.unit.record_cases import make_record

pytestmark = pytest.mark.asyncio


class Listener:
    """A loopback TCP server; `answer` maps a PING to the frame sent back (None: silence)."""

    def __init__(self, answer=lambda ping: Pong(ping.nonce)):
        self.answer, self.connections, self.server = answer, 0, None

    async def __aenter__(self) -> Listener:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                reply = self.answer(await read_frame(reader))
                if reply is not None:
                    await write_frame(writer, reply)
        writer.close()


class Streams:
    """`connect` for LinkProbe: a stream to the peer id's listener; counts the dials."""

    def __init__(self, listeners: dict[str, Listener]):
        self.listeners, self.dials = listeners, []

    async def __call__(self, peer_id: str):
        self.dials.append(peer_id)
        return await asyncio.open_connection("127.0.0.1", self.listeners[peer_id].port)


def record(peer_id: str, state: PeerState = PeerState.ONLINE, addrs: tuple[str, ...] = ()):
    return make_record(peer_id=peer_id, state=state, addrs=addrs)


async def test_round_trips_go_to_peer_ids_never_to_announced_addresses():
    async with Listener() as b, Listener() as target:
        hostile = (f"/ip4/127.0.0.1/tcp/{target.port}/p2p/QmB",)  # B's record points at `target`
        streams = Streams({"QmB": b})
        probe = LinkProbe("QmA", streams)
        for _ in range(3):
            await probe.step([record("QmA"), record("QmB", addrs=hostile)])
        assert target.connections == 0 and streams.dials == ["QmB"] * 3
        assert b.connections == 3 and 0 < probe.rtt_ms["QmB"] < 2000
        assert probe.published() == ((link_tag("QmB"), round(probe.rtt_ms["QmB"], 1)),)


async def test_only_online_and_joining_peers_other_than_itself_are_probed():
    async with Listener() as peer:
        states = {"QmOn": PeerState.ONLINE, "QmJoin": PeerState.JOINING, "QmLeave": PeerState.LEAVING}
        streams = Streams(dict.fromkeys(states, peer))
        probe = LinkProbe("QmA", streams)
        await probe.step([record("QmA"), *(record(p, s) for p, s in states.items())])
        assert sorted(streams.dials) == ["QmJoin", "QmOn"]


async def test_a_step_probes_a_bounded_sample_unmeasured_peers_first():
    async with Listener() as peer:
        ids = [f"Qm{i}" for i in range(10)]
        streams = Streams(dict.fromkeys(ids, peer))
        probe = LinkProbe("QmA", streams, sample=4, seed=0)
        records = [record(p) for p in ids]
        await probe.step(records)
        assert len(streams.dials) == 4
        await probe.step(records)
        assert len(streams.dials) == 8 and len(set(streams.dials)) == 8  # the other peers next
        await probe.step(records[:5])  # peers whose records are gone are forgotten
        assert set(probe.rtt_ms) <= set(ids[:5])


async def test_chain_neighbours_are_probed_first_and_published_first():
    async with Listener() as peer:
        # this peer serves [4, 8): peers holding block 8, or ending a hop at 4, are its neighbours
        ranges = {
            "QmNext": (8, 12),
            "QmOver": (6, 10),
            "QmPrev": (0, 4),
            "QmFar1": (12, 16),
            "QmFar2": (0, 2),
        }
        streams = Streams(dict.fromkeys(ranges, peer))
        probe = LinkProbe("QmA", streams, sample=2, seed=0)
        records = [make_record(peer_id=p, start=s, end=e) for p, (s, e) in ranges.items()]
        for _ in range(3):  # one neighbour and one other a step
            await probe.step(records, serves=(4, 8))
        assert probe.neighbours == {"QmNext", "QmOver", "QmPrev"}
        assert set(streams.dials[::2]) == probe.neighbours  # each neighbour once, before any again
        assert set(streams.dials[1::2]) <= {"QmFar1", "QmFar2"}
        published = [p for p, _ in probe.published()]
        assert set(published[:3]) == {link_tag(p) for p in probe.neighbours}


async def test_a_probe_has_a_deadline_and_a_silent_peer_keeps_its_last_round_trip(monkeypatch):
    monkeypatch.setattr(link_probe, "PROBE_TIMEOUT_S", 0.2)
    async with Listener() as good, Listener(answer=lambda ping: None) as silent:
        streams = Streams({"QmB": good})
        probe = LinkProbe("QmA", streams)
        await probe.step([record("QmB")])
        measured = probe.rtt_ms["QmB"]
        streams.listeners["QmB"] = silent
        began = time.perf_counter()
        await probe.step([record("QmB")])
        assert time.perf_counter() - began < 2 and probe.rtt_ms == {"QmB": measured}


async def test_an_unreachable_peer_is_skipped():
    async def refuse(peer_id: str):
        raise ConnectionRefusedError(peer_id)

    probe = LinkProbe("QmA", refuse)
    await probe.step([record("QmB")])
    assert probe.rtt_ms == {} and probe.published() == ()


@pytest.mark.parametrize(
    "answer",
    [
        lambda ping: Pong(ping.nonce + 1),  # not the nonce it was sent
        lambda ping: Error(ErrorCode.BUSY, "all stream slots are taken"),
    ],
)
async def test_a_wrong_answer_is_no_measurement(answer):
    async with Listener(answer=answer) as peer:
        probe = LinkProbe("QmA", Streams({"QmB": peer}))
        await probe.step([record("QmB")])
        assert probe.rtt_ms == {}


async def test_a_probe_needs_a_sample():
    with pytest.raises(ValueError):
        LinkProbe("QmA", Streams({}), sample=0)


async def test_pings_carry_fresh_nonces():
    seen = []

    def answer(ping: Ping):
        seen.append(ping.nonce)
        return Pong(ping.nonce)

    async with Listener(answer=answer) as peer:
        probe = LinkProbe("QmA", Streams({"QmB": peer}))
        await probe.step([record("QmB")])
        await probe.step([record("QmB")])
    assert len(seen) == 2 * link_probe.PINGS_PER_PROBE and len(set(seen)) == len(seen)
