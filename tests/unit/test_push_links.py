"""PushLinks' link management: a failed link is replaced, a failing peer is backed off from, and
only peers that announce the model are dialed.

The next peers are loopback TCP servers speaking the session frames (no hivemind): one that
acknowledges every pushed step, one that reads them and never answers. `connect` is injected,
so each test counts the dials.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import torch

from hexswarm.peer.push import Backoff, NotAMemberError, PushLinks, SwarmMembers
from hexswarm.swarm.wire.frames import read_frame, write_frame
from hexswarm.swarm.wire.protocol import PushAck, Step

pytestmark = pytest.mark.asyncio


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NextPeer:
    """A loopback server standing for the next peer: `acks` says whether it answers pushes."""

    def __init__(self, acks: bool):
        self.acks, self.connections, self.server = acks, 0, None

    async def start(self) -> NextPeer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                step = await read_frame(reader)
                if self.acks:
                    await write_frame(writer, PushAck(step.session_id))
        writer.close()

    async def connect(self, peer_id: str):
        return await asyncio.open_connection("127.0.0.1", self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        self.server.close()


class Dialer:
    """`connect` for PushLinks: dials `target` (a NextPeer, or None: refused) and counts dials."""

    def __init__(self, target: NextPeer | None):
        self.target, self.dials = target, []

    async def __call__(self, peer_id: str):
        self.dials.append(peer_id)
        if self.target is None:
            raise ConnectionRefusedError(f"no route to {peer_id}")
        return await self.target.connect(peer_id)


def step(session: str = "s") -> Step:
    return Step(session, 0, torch.zeros(1, 1, 2), ack_ms=100)


@contextlib.asynccontextmanager
async def next_peers():
    silent, acking = await NextPeer(acks=False).start(), await NextPeer(acks=True).start()
    try:
        yield silent, acking
    finally:
        silent.close()
        acking.close()


async def test_a_link_whose_ack_times_out_is_replaced_by_a_fresh_one():
    async with next_peers() as (silent, acking):
        dial = Dialer(silent)
        links = PushLinks(dial, backoff=Backoff(first_s=0.0), link_failure_after_s=0.2)
        why = await links.push("QmB", step(), 0.2)
        assert "no PUSH_ACK" in why and "QmB" not in links.links  # closed and dropped
        dial.target = acking  # the peer is back (or was only slow): the next push dials again ...
        began = time.perf_counter()
        assert await links.push("QmB", step(), 5) == ""
        assert time.perf_counter() - began < 2  # ... and is answered, not timed out on the stale link
        assert dial.dials == ["QmB", "QmB"] and silent.connections == acking.connections == 1
        assert await links.push("QmB", step(), 5) == "" and len(dial.dials) == 2  # a good link stays
        links.close()


async def test_pushes_waiting_on_a_link_that_timed_out_fail_at_once():
    async with next_peers() as (silent, _):
        links = PushLinks(Dialer(silent), link_failure_after_s=0.2)
        began = time.perf_counter()
        short, long = await asyncio.gather(
            links.push("QmB", step("a"), 0.2), links.push("QmB", step("b"), 30)
        )
        assert "no PUSH_ACK" in short and "closed" in long
        assert time.perf_counter() - began < 5  # not the 30 s of the second push's own deadline
        assert links.backoff.failing["QmB"][0] == 1  # one failure, however many pushes saw it
        links.close()


async def test_a_clients_short_push_deadline_fails_its_push_alone():
    """ack_ms is the client's: one asking 1 ms must not close the link every client's pushes
    share, nor back the next peer off for them."""
    async with next_peers() as (silent, _):
        dial = Dialer(silent)
        links = PushLinks(dial, link_failure_after_s=0.5)
        assert "within 0.00 s" in await links.push("QmB", step("hostile"), 0.001)  # while connecting
        assert not links.backoff.failing
        assert "no PUSH_ACK" in await links.push("QmB", step("a"), 0.3)
        link = links.links["QmB"]
        assert "no PUSH_ACK" in await links.push("QmB", step("hostile"), 0.001)
        assert links.links["QmB"] is link and not link.closed and not links.backoff.failing
        links.close()


async def test_a_session_pushed_twice_at_once_fails_that_push_alone():
    async with next_peers() as (silent, _):
        links = PushLinks(Dialer(silent), link_failure_after_s=0.2)
        waiting = asyncio.create_task(links.push("QmB", step("s"), 0.5))
        await asyncio.sleep(0.05)
        why = await links.push("QmB", step("s"), 5)  # a client naming one session in two chains
        assert "already waiting" in why and not links.links["QmB"].closed and not links.backoff.failing
        assert "no PUSH_ACK" in await waiting  # the first push keeps its own deadline
        links.close()


async def test_a_failing_peer_is_not_redialed_until_its_backoff_ends():
    clock = Clock()
    dial = Dialer(None)
    links = PushLinks(dial, backoff=Backoff(first_s=1.0, max_s=4.0, clock=clock))
    assert "ConnectionRefusedError" in await links.push("QmB", step(), 1)
    assert "not dialed for 1.0 s" in await links.push("QmB", step(), 1)
    assert len(dial.dials) == 1
    for wait in (1.0, 2.0, 4.0, 4.0):  # doubling with each failure in a row, up to max_s
        clock.now += wait - 0.01
        assert "not dialed" in await links.push("QmB", step(), 1)
        clock.now += 0.02
        assert "ConnectionRefusedError" in await links.push("QmB", step(), 1)
    assert len(dial.dials) == 5
    async with next_peers() as (_, acking):
        dial.target = acking
        clock.now += 4.0
        assert await links.push("QmB", step(), 5) == ""
        assert "QmB" not in links.backoff.failing  # a success forgets the failures
        links.close()


async def test_a_link_closed_by_the_other_side_is_reopened_without_backoff():
    async with next_peers() as (_, acking):
        dial = Dialer(acking)
        links = PushLinks(dial)
        assert await links.push("QmB", step(), 5) == ""
        links.links["QmB"].writer.close()  # as when the next peer drops an idle link
        for _ in range(100):
            if links.links["QmB"].closed:
                break
            await asyncio.sleep(0.02)
        assert await links.push("QmB", step(), 5) == ""
        assert len(dial.dials) == 2 and not links.backoff.failing
        links.close()


class Records:
    """The peer ids a DHT read returns; counts the reads."""

    def __init__(self, *peer_ids: str):
        self.peer_ids, self.reads = list(peer_ids), 0

    async def __call__(self, peer_id: str):
        self.reads += 1
        return list(self.peer_ids)


async def test_a_peer_id_that_does_not_announce_the_model_is_never_dialed():
    clock, records = Clock(), Records("QmB")
    dial = Dialer(None)
    links = PushLinks(dial, members=SwarmMembers(records, refresh_after_s=5.0, clock=clock))
    for _ in range(3):  # a client naming a stranger on every step costs one DHT read per interval
        why = await links.push("QmStranger", step(), 1)
        assert "does not announce this model" in why and "not dialed" in why
    assert dial.dials == [] and records.reads == 1
    clock.now += 5.0
    await links.push("QmStranger", step(), 1)
    assert dial.dials == [] and records.reads == 2
    async with next_peers() as (_, acking):
        dial.target = acking
        assert await links.push("QmB", step(), 5) == "" and dial.dials == ["QmB"]
        links.close()


async def test_a_peer_that_joined_since_the_last_read_is_found_by_a_new_read():
    clock, records = Clock(), Records()
    members = SwarmMembers(records, refresh_after_s=5.0, clock=clock)
    members.update(["QmA"])  # the announce period's read, before QmNew joined
    records.peer_ids = ["QmA", "QmNew"]
    clock.now += 5.0
    await members.check("QmNew")
    assert records.reads == 1 and members.knows("QmA")


async def test_a_record_one_read_missed_is_found_by_the_next_within_the_push_deadline():
    class LateRecords(Records):
        async def __call__(self, peer_id: str):  # the first read meets a replica without QmEdge's record
            self.reads += 1
            return ["QmA"] if self.reads == 1 else ["QmA", "QmEdge"]

    records = LateRecords()
    members = SwarmMembers(records, refresh_after_s=0.05)
    with pytest.raises(NotAMemberError):
        await members.check("QmEdge")  # no time to wait for another read
    await members.check("QmEdge", wait_s=1.0)
    assert records.reads == 2 and members.knows("QmEdge")


async def test_members_outlive_a_failed_read_but_not_their_ttl():
    clock = Clock()
    members = SwarmMembers(Records(), ttl_s=60.0, clock=clock)
    members.update(["QmA"])
    clock.now += 30.0
    members.update([])  # a DHT read that failed returns no records
    assert members.knows("QmA")
    clock.now += 31.0
    members.update(["QmB"])
    assert not members.knows("QmA") and list(members.seen) == ["QmB"]  # pruned, not just ignored


async def test_a_slow_records_read_is_bounded_by_the_push_deadline():
    async def hang(peer_id: str):
        await asyncio.sleep(60)

    links = PushLinks(Dialer(None), members=SwarmMembers(hang))
    began = time.perf_counter()
    why = await links.push("QmB", step(), 0.2)
    assert "could not tell within 0.20 s" in why and time.perf_counter() - began < 5
    assert not links.backoff.failing  # not the next peer's fault
