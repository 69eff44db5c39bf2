"""Dial-backs: can others open a connection to me, directly or through a relay?

A peer asks a few reachable nodes (bootstraps first) on DIALBACK_PROTOCOL to dial it back at
the addresses it lists: its own, or the ports relays hold for it (swarm/port_relay.py). Each helper dials from a fresh libp2p host of its own (a short-lived
p2pd with no listening address and no prior connection), so a success proves that a
stranger can open a connection to the asker and complete libp2p's handshake with its key;
the asker's existing connection to the helper proves nothing. No central web service and no
address ranges decide it (a home network and the tests' "internet" both use private ranges).

The helper never becomes a tool to dial arbitrary hosts: an address is dialed at the IP address
the asker's own connection comes from (with each port it names, so that a forwarded port is
found), or as it is when its IP is that of a node this helper is connected to (a relay's port).
Requests are small, bounded and few at a time.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgpack

from hexswarm.swarm.frames import framed, read_payload
from hexswarm.swarm.maddrs import MAX_MADDR_CHARS, ip_group, tcp_addr, without_peer_id
from hexswarm.swarm.records import unpack_map

logger = logging.getLogger(__name__)

DIALBACK_PROTOCOL = "/hexswarm/dialback/1"
MAX_REQUEST_BYTES = 4096
MAX_ADDRS = 8  # addresses one request may ask to be dialed at
MAX_CONCURRENT = 2  # requests served at once; more are refused at once, not queued
MAX_PER_GROUP = 1  # ... of which from one IP group (many identities on one machine share it)
BUSY = "busy"  # a reply's error when the helper serves others: ask again after BUSY_RETRY_S
BUSY_RETRY_S = 0.5
REQUEST_TIMEOUT_S = 5.0  # to read a request
DIAL_TIMEOUT_S = 3.0  # per address
PROBER_START_S = 10.0
ASK_TIMEOUT_S = 4.0 + MAX_ADDRS * DIAL_TIMEOUT_S / MAX_CONCURRENT  # the asker's wait for one helper


@dataclass(frozen=True)
class DialBackReply:
    """One helper's answer: (address asked about, address it dialed) for each that it reached,
    and the IP address it saw us at. The dialed address is the one to announce: behind a
    forwarded port it is the router's, not the one the peer listens on."""

    helper: str
    reached: tuple[tuple[str, str], ...]
    observed_ip: str = ""
    error: str = ""


def encode_request(addrs: Sequence[str]) -> bytes:
    return msgpack.packb({"addrs": list(addrs)[:MAX_ADDRS]})


def decode_request(payload: bytes) -> list[str]:
    """The addresses asked for; ValueError on anything malformed (remote input)."""
    body = unpack_map(payload)
    addrs = body.get("addrs")
    if not isinstance(addrs, list) or len(addrs) > MAX_ADDRS:
        raise ValueError(f"addrs must be a list of at most {MAX_ADDRS}")
    if not all(isinstance(a, str) and 0 < len(a) <= MAX_MADDR_CHARS for a in addrs):
        raise ValueError(f"each address must be text of at most {MAX_MADDR_CHARS} characters")
    return addrs


def encode_reply(reached: Sequence[tuple[str, str]], observed_ip: str = "", error: str = "") -> bytes:
    return msgpack.packb(
        {"reached": [list(p) for p in reached], "observed_ip": observed_ip, "error": error[:200]}
    )


def decode_reply(helper: str, payload: bytes, asked: Sequence[str]) -> DialBackReply:
    """A helper's reply; only addresses we asked about count (ValueError if malformed)."""
    body = unpack_map(payload)
    reached, observed, error = body.get("reached"), body.get("observed_ip", ""), body.get("error", "")
    if not isinstance(reached, list) or len(reached) > MAX_ADDRS:
        raise ValueError("reached must be a short list")
    if not isinstance(observed, str) or len(observed) > 64 or not isinstance(error, str):
        raise ValueError("observed_ip and error must be short text")
    return DialBackReply(
        helper, tuple(p for p in map(_pair, reached) if _fits(p, asked)), observed, error[:200]
    )


def _pair(item) -> tuple[str, str]:
    if not (isinstance(item, list) and len(item) == 2 and all(isinstance(a, str) for a in item)):
        raise ValueError("each reached entry must be [asked, dialed]")
    return item[0], item[1]


def _fits(pair: tuple[str, str], asked: Sequence[str]) -> bool:
    """A reached address we asked about; a direct one dialed at the port we named."""
    asked_addr, dialed = pair
    if asked_addr not in asked:
        return False
    mine, theirs = tcp_addr(asked_addr), tcp_addr(dialed)
    return mine is not None and theirs is not None and mine.port == theirs.port


def dial_targets(addrs: Iterable[str], observed_ips: set[str], node_ips: set[str]) -> list[tuple[str, str]]:
    """(address asked for, address to dial) pairs this helper may dial for an asker.

    An address whose IP is one this helper knows a node at (`node_ips`) is dialed as it is: a
    relay's port for the asker. Any other is dialed at every IP the asker's own connections
    come from, with the port it names (a port forwarded on the asker's router)."""
    targets: list[tuple[str, str]] = []
    for addr in addrs:
        direct = tcp_addr(addr)
        if direct is None:
            continue
        if direct.ip in node_ips:
            targets.append((addr, without_peer_id(addr)))
            continue
        for ip in sorted(observed_ips):
            family = "ip6" if ":" in ip else "ip4"
            targets.append((addr, f"/{family}/{ip}/tcp/{direct.port}"))
    by_target = {}
    for asked, target in targets:  # 127.0.0.1:P and 192.168.1.2:P are one dial at the observed IP
        by_target.setdefault(target, asked)
    return [(asked, target) for target, asked in by_target.items()][:MAX_ADDRS]


def reachable_verdict(replies: Sequence[DialBackReply | None]) -> bool | None:
    """Direct reachability from helpers' replies: None when no helper answered; otherwise True
    when at least half of those that answered could dial us (a lying helper cannot, alone,
    outvote the bootstrap and another)."""
    answered = [r for r in replies if r is not None and not r.error]
    if not answered:
        return None
    yes = sum(1 for r in answered if r.reached)
    return yes > 0 and 2 * yes >= len(answered)


class DialBackService:
    """Answers DIALBACK_PROTOCOL requests on a reachable node (bootstrap or direct peer)."""

    def __init__(self, p2p):
        self.p2p = p2p
        self.busy: Counter[str] = Counter()  # IP group -> requests being served

    async def handle_stream(self, stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        asker = stream_info.peer_id.to_base58()
        try:
            observed, nodes = await self._what_i_see(asker)
            group = ip_group(min(observed)) if observed else asker
            if self.busy.total() >= MAX_CONCURRENT or self.busy[group] >= MAX_PER_GROUP:
                writer.write(
                    framed(encode_reply((), error=f"{BUSY}: {self.busy.total()} dial-backs running"))
                )
                return
            self.busy[group] += 1
            try:
                payload = await asyncio.wait_for(read_payload(reader, MAX_REQUEST_BYTES), REQUEST_TIMEOUT_S)
                addrs = decode_request(payload)
                reached = await self._dial(asker, dial_targets(addrs, observed, nodes))
            finally:
                self.busy[group] -= 1
            writer.write(framed(encode_reply(reached, observed_ip=min(observed, default=""))))
            logger.info(
                "dial-back for ...%s: reached %d of %d addresses", asker[-8:], len(reached), len(addrs)
            )
        except ValueError as e:
            writer.write(framed(encode_reply((), error=f"malformed request: {e}")))
        except Exception as e:  # remote input must never stop the service
            logger.debug("dial-back for ...%s failed: %s: %s", asker[-8:], type(e).__name__, e)
        finally:
            writer.close()

    async def _what_i_see(self, asker: str) -> tuple[set[str], set[str]]:
        """The IPs the asker's connections come from, and those of this node and of every other
        node it is connected to (where a relay may hold a port for the asker)."""
        observed: set[str] = set()
        nodes = {a.ip for a in (tcp_addr(str(m)) for m in await self.p2p.get_visible_maddrs()) if a}
        for info in await self.p2p.list_peers():
            ips = {a.ip for a in (tcp_addr(str(m)) for m in info.addrs) if a is not None}
            if info.peer_id.to_base58() == asker:
                observed |= ips
            else:
                nodes |= ips
        if not any(ipaddress.ip_address(ip).is_loopback for ip in observed):
            # this machine's loopback is a node's address only for an asker on this machine
            nodes = {ip for ip in nodes if not ipaddress.ip_address(ip).is_loopback}
        return observed, nodes

    async def _dial(self, asker: str, targets: list[tuple[str, str]]) -> list[tuple[str, str]]:
        if not targets:
            return []
        from hivemind.p2p import P2P, PeerID

        prober = await asyncio.wait_for(
            P2P.create(host_maddrs=[], no_listen=True, dht_mode="client", nat_port_map=False, auto_nat=False),
            PROBER_START_S,
        )
        peer = PeerID.from_base58(asker)
        reached: list[tuple[str, str]] = []
        try:
            for asked, target in targets:
                if await _connects(prober, peer, target):
                    reached.append((asked, target))
        finally:
            await prober.shutdown()
        return reached


async def _connects(prober, peer, target: str) -> bool:
    from hivemind.utils.multiaddr import Multiaddr

    try:
        await asyncio.wait_for(
            prober._client.connect(peer, [Multiaddr(without_peer_id(target))]), DIAL_TIMEOUT_S
        )
    except Exception:
        return False
    try:  # the next address must prove itself on a connection of its own
        await asyncio.wait_for(prober._client.disconnect(peer), DIAL_TIMEOUT_S)
    except Exception:
        pass
    return True


async def ask(p2p, helper: str, addrs: Sequence[str], timeout: float = ASK_TIMEOUT_S) -> DialBackReply | None:
    """One helper's dial-back of `addrs`; None if it could not be asked or did not answer."""
    from hivemind.p2p import PeerID

    async def exchange() -> DialBackReply:
        _, reader, writer = await p2p.call_binary_stream_handler(
            PeerID.from_base58(helper), DIALBACK_PROTOCOL
        )
        try:
            writer.write(framed(encode_request(addrs)))
            await writer.drain()
            return decode_reply(helper, await read_payload(reader, MAX_REQUEST_BYTES), addrs)
        finally:
            writer.close()

    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = await asyncio.wait_for(exchange(), max(deadline - time.monotonic(), 0.1))
        except Exception as e:
            logger.debug("dial-back by ...%s: %s: %s", helper[-8:], type(e).__name__, e)
            return None
        # a busy helper (its other requests, or one from our IP group) is asked again, not skipped:
        # peers behind one NAT that start together must not read "busy" as "nobody could check"
        if not reply.error.startswith(BUSY) or time.monotonic() + BUSY_RETRY_S >= deadline:
            return reply
        await asyncio.sleep(BUSY_RETRY_S * random.uniform(1, 2))


async def ask_many(p2p, helpers: Sequence[str], addrs: Sequence[str]) -> list[DialBackReply | None]:
    """Asks every helper at once."""
    return list(await asyncio.gather(*(ask(p2p, helper, addrs) for helper in helpers)))


async def _connection_ips(p2p, peer_id: str) -> list[str]:
    """The IPs a connected peer's connections come from, sorted; none if it is not connected."""
    for info in await p2p.list_peers():
        if info.peer_id.to_base58() == peer_id:
            ips = sorted(a.ip for a in (tcp_addr(str(m)) for m in info.addrs) if a is not None)
            if ips:
                return ips
    return []


async def ip_group_of(p2p, peer_id: str) -> str:
    """The IP group a connected peer's connections come from (its id if none is known)."""
    ips = await _connection_ips(p2p, peer_id)
    return ip_group(ips[0]) if ips else peer_id


async def admission_group_of(p2p, peer_id: str) -> str | None:
    """The IP group a connected remote counts under for a peer's limits (peer/admission.py);
    None when it connects over loopback (a swarm on one machine is one operator's)."""
    ips = await _connection_ips(p2p, peer_id)
    if ips and all(ipaddress.ip_address(ip).is_loopback for ip in ips):
        return None
    return ip_group(ips[0]) if ips else peer_id


async def serve_helpers(p2p, limits):
    """What a reachable node serves peers behind NAT on `p2p`: dial-backs and, with `limits`,
    relay slots (swarm/port_relay.py). Returns the relay (None without `limits`), for close."""
    from functools import partial

    from hexswarm.swarm.port_relay import RELAY_PROTOCOL, RelayService

    await p2p.add_binary_stream_handler(DIALBACK_PROTOCOL, DialBackService(p2p).handle_stream)
    if limits is None:
        return None
    relay = RelayService(limits=limits, group_of=partial(ip_group_of, p2p))
    await relay.start()
    await p2p.add_binary_stream_handler(RELAY_PROTOCOL, relay.handle_stream)
    return relay
