"""Relaying a peer behind NAT through a TCP port on a reachable node.

Why not libp2p's circuit relay v2: hivemind's p2pd starts a relay service with libp2p's stock
limits (128 KiB and 2 minutes per relayed connection) whenever relaying is on, after and over
the one its -relayDataLimit/-relayTimeLimit flags configure (its main.go calls EnableRelayV2()
unconditionally). 128 KiB is one prompt of a small model's hidden states, so every relayed
session would be reset mid-prompt. Measured here: a relayed echo stream is reset after 65,536
bytes of 4 MiB. So reachable nodes relay at the TCP level instead:

1. The peer behind NAT opens a libp2p stream to the relay on RELAY_PROTOCOL (authenticated:
   the relay knows whose slot it is) and asks for a slot.
2. The relay listens on a public TCP port for it and replies with that port and its tunnel port.
   The peer announces `/ip4/<relay ip>/tcp/<port>/p2p/<its own id>`: an ordinary address.
3. For each connection to that port that sends its first byte within FIRST_BYTE_TIMEOUT_S
   (others are closed unpaired), the relay sends a one-time token on the stream; the peer
   opens a TCP connection to the tunnel port, sends the token, and splices it to its own p2pd.

libp2p's handshake runs end to end through the splice, so the relay sees only ciphertext and
cannot pose as the peer. Slots, connections, bytes and lifetimes are bounded (RelayLimits); a
slot ends when its stream does. A slot's connections are also bounded per IP group of the
client, so one machine's idle connections cannot lock a relayed peer out; the tunnel port takes
connections only from machines the relay holds slots for (or loopback) and at most
`max_connections` unpaired at a time from each.

The relay names each client's IP in its "open" message, and the peer keeps it against the
local port its tunnel reaches its own p2pd from (`TunnelSources`): to its daemon every relayed
remote comes from loopback, and per-IP-group limits (peer/admission.py) would see one client.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgpack

from hexswarm.swarm.nat.relay_limits import RelayLimits
from hexswarm.swarm.net.maddrs import ip_group
from hexswarm.swarm.trust.records import unpack_map
from hexswarm.swarm.wire.frames import framed, read_payload

logger = logging.getLogger(__name__)

RELAY_PROTOCOL = "/hexswarm/relay/1"
MAX_MESSAGE_BYTES = 1024
TOKEN_BYTES = 16
PAIRING_TIMEOUT_S = 10.0  # a client's connection waits this long for the peer's tunnel
# A libp2p dialer speaks first (multistream-select's header), so a connection that has sent
# nothing by then is no client: it is closed before the peer is asked for a tunnel, and idle
# connections cannot hold a slot's places (max_connections, ... per group) for longer.
FIRST_BYTE_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 5.0
COPY_CHUNK = 1 << 16


def _frame(body: dict) -> bytes:
    return framed(msgpack.packb(body))


async def _read_message(reader: asyncio.StreamReader, timeout: float | None) -> dict:
    """One control message (remote input): ValueError unless it is a small msgpack map."""
    return unpack_map(await asyncio.wait_for(read_payload(reader, MAX_MESSAGE_BYTES), timeout))


async def splice(a: tuple, b: tuple, data_limit: int, time_limit: float, first: bytes = b"") -> None:
    """Copies both ways between two (reader, writer) pairs until either side ends, a direction
    passes `data_limit` bytes, or `time_limit` seconds pass; then closes both. `first`: what
    was already read from `a`, sent to `b` first and counted."""

    async def copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes = b"") -> None:
        sent = 0
        while data := data or await reader.read(COPY_CHUNK):
            sent += len(data)
            if sent > data_limit:
                return
            writer.write(data)
            await writer.drain()
            data = b""

    tasks = [asyncio.create_task(copy(a[0], b[1], first)), asyncio.create_task(copy(b[0], a[1]))]
    try:
        await asyncio.wait(tasks, timeout=time_limit, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for _, writer in (a, b):
            writer.close()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class _Slot:
    peer_id: str
    server: asyncio.AbstractServer | None  # None while its port is being opened
    control: asyncio.StreamWriter
    group: str = ""
    connections: int = 0
    by_group: Counter = field(default_factory=Counter)  # open connections per client IP group

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@dataclass
class RelayService:
    """The relay side: slots for peers behind NAT on this node's public TCP ports."""

    host: str = "0.0.0.0"
    limits: RelayLimits = field(default_factory=RelayLimits)
    # peer id -> the IP group its connections come from (swarm/nat/reachability/service.py ip_group_of)
    group_of: Callable[[str], Awaitable[str]] | None = None
    slots: dict[str, _Slot] = field(default_factory=dict)
    pending: dict[bytes, asyncio.Future] = field(default_factory=dict)
    unpaired: Counter = field(default_factory=Counter)  # tunnel connections without a token yet, per group
    tunnel: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.tunnel = await asyncio.start_server(self._tunnel_arrived, self.host, 0)

    @property
    def free_slots(self) -> int:
        """Slots it would still give (what its peer's record announces)."""
        return max(0, self.limits.max_slots - len(self.slots))

    @property
    def tunnel_port(self) -> int:
        return self.tunnel.sockets[0].getsockname()[1]

    def close(self) -> None:
        for slot in list(self.slots.values()):
            slot.close()
        if self.tunnel is not None:
            self.tunnel.close()

    async def handle_stream(self, stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        """One slot for the stream's peer, held while the stream lasts."""
        peer_id = stream_info.peer_id.to_base58()
        try:
            request = await _read_message(reader, REQUEST_TIMEOUT_S)
            if request.get("want") != "slot":
                raise ValueError("expected {'want': 'slot'}")
            if peer_id in self.slots:
                self.slots.pop(peer_id).close()  # its previous slot's stream is stale
            group = await self.group_of(peer_id) if self.group_of else peer_id
            refusal = self._refusal(group)
            if refusal:
                writer.write(_frame({"error": refusal}))
                return
            slot = await self._open_slot(peer_id, writer, group)
            writer.write(
                _frame({"port": slot.server.sockets[0].getsockname()[1], "tunnel_port": self.tunnel_port})
            )
            await writer.drain()
            logger.info("relaying ...%s on port %d", peer_id[-8:], slot.server.sockets[0].getsockname()[1])
            await reader.read()  # the slot lasts until the peer closes the stream or is gone
        except (ValueError, TimeoutError, ConnectionError, asyncio.IncompleteReadError) as e:
            logger.debug("relay slot for ...%s: %s: %s", peer_id[-8:], type(e).__name__, e)
        except asyncio.CancelledError:  # the relay is stopping: not an error (see _client_arrived)
            logger.debug("relay slot for ...%s: closed as the relay stops", peer_id[-8:])
        finally:
            slot = self.slots.get(peer_id)
            if slot is not None and slot.control is writer:
                del self.slots[peer_id]
                slot.close()
                logger.info("stopped relaying ...%s", peer_id[-8:])
            writer.close()

    def _refusal(self, group: str) -> str:
        if len(self.slots) >= self.limits.max_slots:
            return f"relay full: {self.limits.max_slots} slots"
        if sum(slot.group == group for slot in self.slots.values()) >= self.limits.max_slots_per_group:
            return f"{self.limits.max_slots_per_group} slots from {group} already"
        return ""

    async def _open_slot(self, peer_id: str, control: asyncio.StreamWriter, group: str) -> _Slot:
        """The slot is counted before the first await: the limits were checked just before,
        with no await between, so concurrent requests cannot all pass the same check."""
        slot = _Slot(peer_id, None, control)
        slot.group = group
        self.slots[peer_id] = slot
        try:
            slot.server = await asyncio.start_server(
                lambda r, w: self._client_arrived(slot, r, w), self.host, 0
            )
        except BaseException:
            if self.slots.get(peer_id) is slot:
                del self.slots[peer_id]
            raise
        return slot

    async def _client_arrived(self, slot: _Slot, reader, writer) -> None:
        """A connection to a relayed peer's port: ask the peer for a tunnel, then splice."""
        ip = _peer_ip(writer)
        group = ip_group(ip) if ip else ""
        if (
            slot.connections >= self.limits.max_connections
            or slot.by_group[group] >= self.limits.max_connections_per_group
            or self.slots.get(slot.peer_id) is not slot
        ):
            writer.close()
            return
        slot.connections += 1
        slot.by_group[group] += 1
        token = secrets.token_bytes(TOKEN_BYTES)
        try:
            first = await asyncio.wait_for(reader.read(COPY_CHUNK), FIRST_BYTE_TIMEOUT_S)
            if not first:
                raise ConnectionError("closed before its first byte")
            arrived = self.pending[token] = asyncio.get_running_loop().create_future()
            slot.control.write(_frame({"open": token, "from": ip}))
            await slot.control.drain()
            tunnel = await asyncio.wait_for(arrived, PAIRING_TIMEOUT_S)
            limits = self.limits
            await splice((reader, writer), tunnel, limits.data_limit_bytes, limits.time_limit_s, first)
        except (TimeoutError, ConnectionError, OSError):
            writer.close()
        except asyncio.CancelledError:
            # The relay is stopping. This task is asyncio's server callback, which reads its
            # exception when done: a re-raised cancellation would print as an error.
            writer.close()
        finally:
            self.pending.pop(token, None)
            slot.connections -= 1
            slot.by_group[group] -= 1

    async def _tunnel_arrived(self, reader, writer) -> None:
        """The relayed peer's side of a connection: it names the token it was sent. Only machines
        this relay holds slots for (or this machine) may connect, a bounded number unpaired at once."""
        ip = _peer_ip(writer)
        group = ip_group(ip) if ip else ""
        local = bool(ip) and ipaddress.ip_address(ip).is_loopback
        if not local and (
            all(slot.group != group for slot in self.slots.values())
            or self.unpaired[group] >= self.limits.max_connections
        ):
            writer.close()
            return
        self.unpaired[group] += 1
        try:
            token = await asyncio.wait_for(reader.readexactly(TOKEN_BYTES), PAIRING_TIMEOUT_S)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            writer.close()  # a cancellation: the relay is stopping (see _client_arrived)
            return
        finally:
            self.unpaired[group] -= 1
        waiter = self.pending.pop(token, None)
        if waiter is None or waiter.done():
            writer.close()  # an unknown or spent token: nobody's tunnel
            return
        waiter.set_result((reader, writer))


@dataclass
class Slot:
    """What a relay gave us: where others reach us through it."""

    relay_id: str
    relay_ip: str
    port: int
    tunnel_port: int

    def addr(self, peer_id: str) -> str:
        family = "ip6" if ":" in self.relay_ip else "ip4"
        return f"/{family}/{self.relay_ip}/tcp/{self.port}/p2p/{peer_id}"


async def hold_slot(
    p2p,
    relay_id: str,
    relay_ip: str,
    local: tuple[str, int],
    on_slot: Callable[[Slot], None],
    limits: RelayLimits | None = None,
    sources: TunnelSources | None = None,
) -> None:
    """The relayed peer's side: asks `relay_id` for a slot, calls `on_slot`, then opens a tunnel
    to `local` (its own p2pd's host and port) for each connection the relay announces. Returns when the
    relay ends the slot or is gone; raises ValueError on a refusal."""
    from hivemind.p2p import PeerID

    limits = limits or RelayLimits()
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(relay_id), RELAY_PROTOCOL)
    tunnels: set[asyncio.Task] = set()
    try:
        writer.write(_frame({"want": "slot"}))
        await writer.drain()
        reply = await _read_message(reader, REQUEST_TIMEOUT_S)
        if "error" in reply or not _is_port(reply.get("port")) or not _is_port(reply.get("tunnel_port")):
            raise ValueError(
                f"relay ...{relay_id[-8:]} refused a slot: {str(reply.get('error', reply))[:200]}"
            )
        slot = Slot(relay_id, relay_ip, reply["port"], reply["tunnel_port"])
        on_slot(slot)
        while True:
            message = await _read_message(reader, None)
            token = message.get("open")
            if (
                isinstance(token, bytes)
                and len(token) == TOKEN_BYTES
                and len(tunnels) < limits.max_connections
            ):
                source = _checked_ip(message.get("from"))
                task = asyncio.create_task(_open_tunnel(slot, token, local, limits, sources, source))
                tunnels.add(task)
                task.add_done_callback(tunnels.discard)
    except (asyncio.IncompleteReadError, ConnectionError):
        return
    finally:
        writer.close()
        for task in tunnels:
            task.cancel()


async def _open_tunnel(
    slot: Slot,
    token: bytes,
    local: tuple[str, int],
    limits: RelayLimits,
    sources: TunnelSources | None = None,
    source: str = "",
) -> None:
    try:
        relay = await asyncio.wait_for(
            asyncio.open_connection(slot.relay_ip, slot.tunnel_port), PAIRING_TIMEOUT_S
        )
        relay[1].write(token)
        daemon = await asyncio.wait_for(asyncio.open_connection(*local), PAIRING_TIMEOUT_S)
    except (TimeoutError, OSError) as e:
        logger.debug("tunnel through ...%s: %s: %s", slot.relay_id[-8:], type(e).__name__, e)
        return
    port = daemon[1].get_extra_info("sockname")[1]
    if sources is not None and source:
        sources.by_port[port] = source
    try:
        await splice(relay, daemon, limits.data_limit_bytes, limits.time_limit_s)
    finally:
        if sources is not None:
            sources.by_port.pop(port, None)


def _peer_ip(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return peer[0] if isinstance(peer, tuple) and peer else ""


class TunnelSources:
    """The relayed peer's record of who is behind each tunnel: the local port a tunnel reaches
    its own p2pd from -> the client's IP as the relay saw it (the relay the peer chose to hold a
    slot on vouches for it). Bounded by the tunnels open at once."""

    def __init__(self):
        self.by_port: dict[int, str] = {}

    def group_of_port(self, port: int) -> str | None:
        ip = self.by_port.get(port)
        return ip_group(ip) if ip else None


def _checked_ip(value) -> str:
    """An IP address from the relay's message (remote input), or "" if it is not one."""
    try:
        return str(ipaddress.ip_address(value)) if isinstance(value, str) else ""
    except ValueError:
        return ""


def _is_port(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536
