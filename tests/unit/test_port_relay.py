"""The TCP relay for peers behind NAT (swarm/nat/port_relay.py), on 127.0.0.1: a slot, a tunnel per
connection, the limits. The libp2p stream that carries the slot's control messages is stood in
for by a loopback TCP connection; everything else is the real code."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import pytest

from hexswarm.swarm.nat.port_relay import RelayLimits, RelayService, Slot, _frame, _open_tunnel, _read_message

pytestmark = pytest.mark.asyncio


@dataclass
class FakePeerId:
    text: str

    def to_base58(self) -> str:
        return self.text


@dataclass
class StreamInfo:
    peer_id: FakePeerId


async def echo(reader, writer):
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()


async def same_machine(peer_id: str) -> str:
    return "203.0.113.0/24"  # every identity in these tests comes from one IP group


@contextlib.asynccontextmanager
async def relay_with_slot(limits: RelayLimits, peer: str = "QmPeer", daemon_handler=echo):
    """A relay, an echo server (or `daemon_handler`) as the relayed peer's daemon, and a slot held
    for `peer`: yields (relay, slot, control reader, daemon address)."""
    relay = RelayService(host="127.0.0.1", limits=limits, group_of=same_machine)
    await relay.start()
    daemon = await asyncio.start_server(daemon_handler, "127.0.0.1", 0)
    accepted = asyncio.get_running_loop().create_future()
    control_server = await asyncio.start_server(lambda r, w: accepted.set_result((r, w)), "127.0.0.1", 0)
    peer_reader, peer_writer = await asyncio.open_connection(
        "127.0.0.1", control_server.sockets[0].getsockname()[1]
    )
    relay_side = await accepted
    held = asyncio.create_task(relay.handle_stream(StreamInfo(FakePeerId(peer)), *relay_side))
    peer_writer.write(_frame({"want": "slot"}))
    reply = await _read_message(peer_reader, 5)
    slot = Slot("QmRelay", "127.0.0.1", reply["port"], reply["tunnel_port"])
    try:
        yield relay, slot, peer_reader, ("127.0.0.1", daemon.sockets[0].getsockname()[1])
    finally:
        peer_writer.close()
        await asyncio.wait_for(held, 5)
        relay.close()
        daemon.close()
        control_server.close()


async def relayed_echo(slot, control, daemon, limits, payload: bytes) -> bytes:
    client_reader, client_writer = await asyncio.open_connection("127.0.0.1", slot.port)
    client_writer.write(payload)  # a client speaks first, as libp2p's dialer does
    message = await _read_message(control, 5)  # then the relay asks the peer for a tunnel
    tunnel = asyncio.create_task(_open_tunnel(slot, message["open"], daemon, limits))
    await client_writer.drain()
    received = b""
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while len(received) < len(payload):
            chunk = await asyncio.wait_for(client_reader.read(1 << 16), 5)
            if not chunk:
                break
            received += chunk
    client_writer.close()
    tunnel.cancel()
    return received


async def test_a_relayed_connection_carries_far_more_than_libp2ps_128_kib():
    limits = RelayLimits()
    async with relay_with_slot(limits) as (_, slot, control, daemon):
        payload = bytes(range(256)) * 16384  # 4 MiB
        assert await relayed_echo(slot, control, daemon, limits, payload) == payload


async def test_a_connection_past_its_data_limit_is_closed():
    limits = RelayLimits(data_limit_bytes=100_000)
    async with relay_with_slot(limits) as (_, slot, control, daemon):
        assert len(await relayed_echo(slot, control, daemon, limits, b"x" * 1_000_000)) <= 100_000
    # what reached the daemon: the data up to the limit (less at most one read of 64 KiB), then the end
    arrived: list[int] = []
    ended = asyncio.get_running_loop().create_future()

    async def sink(reader, writer):
        while data := await reader.read(1 << 16):
            arrived.append(len(data))
        if not ended.done():
            ended.set_result(True)
        writer.close()

    async with relay_with_slot(limits, daemon_handler=sink) as (_, slot, control, daemon):
        _, client_writer = await asyncio.open_connection("127.0.0.1", slot.port)
        client_writer.write(b"x" * 1_000_000)
        message = await _read_message(control, 5)  # the relay asks the peer for a tunnel
        tunnel = asyncio.create_task(_open_tunnel(slot, message["open"], daemon, limits))
        with contextlib.suppress(ConnectionError):
            await client_writer.drain()
        await asyncio.wait_for(ended, 10)  # the tunnel closed the daemon's side: all it carried is in
        client_writer.close()
        tunnel.cancel()
        assert 100_000 - (1 << 16) < sum(arrived) <= 100_000


async def test_a_tunnel_with_an_unknown_token_is_closed_and_the_slot_ends_with_its_stream():
    async with relay_with_slot(RelayLimits()) as (relay, slot, _, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", slot.tunnel_port)
        writer.write(b"\0" * 16)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert list(relay.slots) == ["QmPeer"]
    assert relay.slots == {}


@pytest.mark.parametrize(
    "limits, refusal",
    [
        (RelayLimits(max_slots=1), "relay full"),
        (RelayLimits(max_slots_per_group=1), "1 slots from 203.0.113.0/24"),
    ],
)
async def test_a_full_relay_or_ip_group_is_refused_a_slot(limits, refusal):
    async with relay_with_slot(limits) as (relay, *_):
        assert relay.free_slots == limits.max_slots - 1  # what its peer's record announces
        second = asyncio.get_running_loop().create_future()
        server = await asyncio.start_server(lambda r, w: second.set_result((r, w)), "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        handled = asyncio.create_task(relay.handle_stream(StreamInfo(FakePeerId("QmOther")), *await second))
        writer.write(_frame({"want": "slot"}))
        assert refusal in (await _read_message(reader, 5))["error"]
        await asyncio.wait_for(handled, 5)
        writer.close()
        server.close()


async def test_concurrent_requests_from_one_ip_group_get_no_more_slots_than_its_limit():
    """40 identities of one /24 ask at once: the limit is checked and the slot taken with no
    await between, so at most max_slots_per_group are granted (issue 49's race)."""
    relay = RelayService(host="127.0.0.1", limits=RelayLimits(max_slots_per_group=8), group_of=same_machine)
    await relay.start()
    accepted: asyncio.Queue = asyncio.Queue()
    server = await asyncio.start_server(lambda r, w: accepted.put_nowait((r, w)), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clients, handlers = [], []
    for i in range(40):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        clients.append((reader, writer))
        relay_side = await accepted.get()
        handlers.append(
            asyncio.create_task(relay.handle_stream(StreamInfo(FakePeerId(f"QmSybil{i}")), *relay_side))
        )
    for _, writer in clients:
        writer.write(_frame({"want": "slot"}))
    replies = await asyncio.gather(*(_read_message(reader, 5) for reader, _ in clients))
    granted = [r for r in replies if "port" in r]
    assert len(granted) == 8, [r.get("error") for r in replies if "error" in r][:3]
    assert all("8 slots from 203.0.113.0/24 already" in r["error"] for r in replies if "error" in r)
    for _, writer in clients:
        writer.close()
    await asyncio.wait_for(asyncio.gather(*handlers), 5)
    assert not relay.slots
    relay.close()
    server.close()


async def test_one_machine_cannot_take_every_connection_of_a_relayed_peer():
    """Idle connections from one IP group take at most max_connections_per_group of a slot's; a
    client from another group still gets through, and its IP reaches the relayed peer."""
    limits = RelayLimits(max_connections=16, max_connections_per_group=4)
    async with relay_with_slot(limits) as (_, slot, control, _):
        hoarded = [await asyncio.open_connection("127.0.0.1", slot.port) for _ in range(6)]
        for _, writer in hoarded[:4]:
            writer.write(b"/multistream/1.0.0\n")  # each speaks, as a dialer does
        asked = [await _read_message(control, 5) for _ in range(4)]  # 4 tunnels asked for, no more
        assert all(m["from"] == "127.0.0.1" for m in asked)
        refused = [await asyncio.wait_for(reader.read(), 5) for reader, _ in hoarded[4:]]
        assert refused == [b"", b""]  # the 5th and 6th were closed at once
        _, other = await asyncio.open_connection("127.0.0.1", slot.port, local_addr=("127.1.0.1", 0))
        other.write(b"/multistream/1.0.0\n")
        assert (await _read_message(control, 5))["from"] == "127.1.0.1"
        for _, writer in [*hoarded, (None, other)]:
            writer.close()


class FakeWriter:
    def __init__(self, ip: str):
        self.ip, self.closed = ip, False

    def get_extra_info(self, name):
        return (self.ip, 4242) if name == "peername" else None

    def close(self):
        self.closed = True


async def test_the_tunnel_port_takes_only_machines_it_holds_slots_for():
    async with relay_with_slot(RelayLimits()) as (relay, *_):
        stranger = FakeWriter("198.51.100.9")  # no slot from 198.51.100.0/24
        await relay._tunnel_arrived(asyncio.StreamReader(), stranger)
        assert stranger.closed and not relay.unpaired["198.51.100.0/24"]


async def test_a_relayed_remote_counts_under_the_ip_group_its_relay_named():
    from hexswarm.swarm.nat.port_relay import TunnelSources
    from hexswarm.swarm.nat.reachability.service import admission_group_of

    @dataclass
    class Info:
        peer_id: FakePeerId
        addrs: list

    class P2P:
        async def list_peers(self):
            return [
                Info(FakePeerId("QmTunneled"), ["/ip4/127.0.0.1/tcp/50001"]),
                Info(FakePeerId("QmLocal"), ["/ip4/127.0.0.1/tcp/50002"]),
                Info(FakePeerId("QmDirect"), ["/ip4/198.51.100.9/tcp/4001"]),
            ]

    sources = TunnelSources()
    sources.by_port[50001] = "203.0.113.77"
    assert await admission_group_of(P2P(), "QmTunneled", sources) == "203.0.113.0/24"
    assert await admission_group_of(P2P(), "QmLocal", sources) is None  # this machine's own
    assert await admission_group_of(P2P(), "QmDirect", sources) == "198.51.100.0/24"


async def test_a_connection_that_sends_nothing_is_closed_within_seconds_and_frees_its_place():
    """Idle TCP connections to a slot (no libp2p handshake, not one byte) are closed at the
    relay's first-byte deadline, without a tunnel asked of the peer, so they cannot hold the
    per-group cap; the per-group cap and max_connections still hold meanwhile."""
    from hexswarm.swarm.nat.port_relay import FIRST_BYTE_TIMEOUT_S

    limits = RelayLimits(max_connections=5, max_connections_per_group=4)
    async with relay_with_slot(limits) as (_, slot, control, _):
        began = asyncio.get_running_loop().time()
        idle = [await asyncio.open_connection("127.0.0.1", slot.port) for _ in range(4)]
        _, over = await asyncio.open_connection("127.0.0.1", slot.port)  # the group's 5th
        other = [
            await asyncio.open_connection("127.0.0.1", slot.port, local_addr=(f"127.1.0.{i}", 0))
            for i in (1, 2)
        ]  # another group: one place of max_connections is left, then none
        closed = [await asyncio.wait_for(reader.read(), FIRST_BYTE_TIMEOUT_S + 2) for reader, _ in idle]
        assert closed == [b""] * 4
        assert asyncio.get_running_loop().time() - began < FIRST_BYTE_TIMEOUT_S + 1.5
        assert await asyncio.wait_for(other[1][0].read(), 1) == b""  # over max_connections at once
        with pytest.raises(TimeoutError):  # nothing was asked of the peer for a silent connection
            await _read_message(control, 0.2)
        # the places are free again: a client of the same group that speaks gets its tunnel
        reader, writer = await asyncio.open_connection("127.0.0.1", slot.port)
        writer.write(b"/multistream/1.0.0\n")
        assert (await _read_message(control, 5))["from"] == "127.0.0.1"
        for _, w in [*idle, (None, over), *other, (None, writer)]:
            w.close()
