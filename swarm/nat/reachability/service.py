"""The dial-back helper's side: what a reachable node (bootstrap or direct peer) dials for an
asker, and the IP groups of the nodes it is connected to (the protocol: messages.py)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections import Counter
from collections.abc import Iterable

from hexswarm.swarm.nat.port_relay import TunnelSources
from hexswarm.swarm.nat.reachability.messages import (
    BUSY,
    DIAL_TIMEOUT_S,
    DIALBACK_PROTOCOL,
    MAX_ADDRS,
    MAX_CONCURRENT,
    MAX_PER_GROUP,
    MAX_REQUEST_BYTES,
    PROBER_START_S,
    REQUEST_TIMEOUT_S,
    decode_request,
    encode_reply,
)
from hexswarm.swarm.net.maddrs import ip_group, tcp_addr, without_peer_id
from hexswarm.swarm.wire.frames import framed, read_payload

logger = logging.getLogger(__name__)


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


async def _connection_addrs(p2p, peer_id: str) -> list:
    """The TCP addresses (ip, port) a connected peer's connections come from, sorted by IP;
    none if it is not connected."""
    for info in await p2p.list_peers():
        if info.peer_id.to_base58() == peer_id:
            addrs = sorted(
                (a for a in (tcp_addr(str(m)) for m in info.addrs) if a is not None), key=lambda a: a.ip
            )
            if addrs:
                return addrs
    return []


async def _connection_ips(p2p, peer_id: str) -> list[str]:
    """The IPs a connected peer's connections come from, sorted; none if it is not connected."""
    return [a.ip for a in await _connection_addrs(p2p, peer_id)]


async def ip_group_of(p2p, peer_id: str) -> str:
    """The IP group a connected peer's connections come from (its id if none is known)."""
    ips = await _connection_ips(p2p, peer_id)
    return ip_group(ips[0]) if ips else peer_id


async def admission_group_of(p2p, peer_id: str, sources: TunnelSources | None = None) -> str | None:
    """The IP group a connected remote counts under for a peer's limits (peer/admission.py);
    for a peer behind NAT, whose remotes all reach its daemon through tunnels from loopback, the
    group of the client IP its relay named for that tunnel (`sources`); None when it connects
    over loopback otherwise (a swarm on one machine is one operator's)."""
    addrs = await _connection_addrs(p2p, peer_id)
    if addrs and all(ipaddress.ip_address(a.ip).is_loopback for a in addrs):
        relayed = sorted(g for g in (sources.group_of_port(a.port) for a in addrs) if g) if sources else []
        return relayed[0] if relayed else None
    return ip_group(addrs[0].ip) if addrs else peer_id


async def serve_helpers(p2p, limits):
    """What a reachable node serves peers behind NAT on `p2p`: dial-backs and, with `limits`,
    relay slots (swarm/nat/port_relay.py). Returns the relay (None without `limits`), for close."""
    from functools import partial

    from hexswarm.swarm.nat.port_relay import RELAY_PROTOCOL, RelayService

    await p2p.add_binary_stream_handler(DIALBACK_PROTOCOL, DialBackService(p2p).handle_stream)
    if limits is None:
        return None
    relay = RelayService(limits=limits, group_of=partial(ip_group_of, p2p))
    await relay.start()
    await p2p.add_binary_stream_handler(RELAY_PROTOCOL, relay.handle_stream)
    return relay
