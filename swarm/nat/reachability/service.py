"""The dial-back helper's side: what a reachable node (bootstrap or direct peer) dials for an
asker, and the IP groups of the nodes it is connected to (the protocol: messages.py).

What bounds it, against strangers who can all open streams to it: MAX_CONCURRENT requests at
once, MAX_PER_GROUP of them and GROUP_PER_MINUTE a minute from one IP group (checked and taken
together, before any await); a request read within REQUEST_TIMEOUT_S and dialed within
DIAL_BUDGET_S; every dial at the asker's own IP, or at a slot this node's relay holds for it;
probes from a few reused daemons (probers.py), not a fresh p2pd per request."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Iterable

from hexswarm.swarm.nat.port_relay import TunnelSources
from hexswarm.swarm.nat.reachability.messages import (
    BUSY,
    DIAL_BUDGET_S,
    DIAL_TIMEOUT_S,
    DIALBACK_PROTOCOL,
    GROUP_PER_MINUTE,
    MAX_ADDRS,
    MAX_CONCURRENT,
    MAX_PER_GROUP,
    MAX_REQUEST_BYTES,
    REQUEST_TIMEOUT_S,
    decode_request,
    encode_reply,
)
from hexswarm.swarm.nat.reachability.probers import ProberPool
from hexswarm.swarm.net.maddrs import ip_group, tcp_addr, without_peer_id
from hexswarm.swarm.trust.rates import KeyedRate
from hexswarm.swarm.wire.frames import framed, read_payload

logger = logging.getLogger(__name__)


def dial_targets(
    addrs: Iterable[str], observed_ips: set[str], own_slots: dict[int, str] | None = None
) -> list[tuple[str, str, str]]:
    """(address asked for, address to dial, address to report) for what this helper may dial.

    An address whose port is a slot this node's own relay holds for the asker (`own_slots`:
    port -> the local host it listens on) is dialed there and reported as asked: the relay
    vouches for its own slot. Any other is dialed at every IP the asker's own connections come
    from, with the port it names (a port forwarded on the asker's router), and nowhere else."""
    targets: list[tuple[str, str, str]] = []
    for addr in addrs:
        direct = tcp_addr(addr)
        if direct is None:
            continue
        host = (own_slots or {}).get(direct.port)
        if host is not None:
            family = "ip6" if ":" in host else "ip4"
            targets.append((addr, f"/{family}/{host}/tcp/{direct.port}", without_peer_id(addr)))
            continue
        for ip in sorted(observed_ips):
            family = "ip6" if ":" in ip else "ip4"
            dialed = f"/{family}/{ip}/tcp/{direct.port}"
            targets.append((addr, dialed, dialed))
    by_target = {}
    for target in targets:  # 127.0.0.1:P and 192.168.1.2:P are one dial at the observed IP
        by_target.setdefault(target[1], target)
    return list(by_target.values())[:MAX_ADDRS]


class DialBackService:
    """Answers DIALBACK_PROTOCOL requests on a reachable node (bootstrap or direct peer);
    `relay` (a RelayService, or None) names the slots it holds."""

    def __init__(self, p2p, relay=None, pool: ProberPool | None = None):
        self.p2p, self.relay = p2p, relay
        self.pool = pool or ProberPool()
        self.busy: Counter[str] = Counter()  # IP group -> requests being served
        self.rates = KeyedRate(GROUP_PER_MINUTE)  # requests a minute per IP group

    async def handle_stream(self, stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        asker = stream_info.peer_id.to_base58()
        try:
            observed = await self._observed(asker)
            group = ip_group(min(observed)) if observed else asker
            refusal = self._take(group)  # no await between the checks and the taking
            if refusal:
                writer.write(framed(encode_reply((), error=f"{BUSY}: {refusal}")))
                return
            try:
                payload = await asyncio.wait_for(read_payload(reader, MAX_REQUEST_BYTES), REQUEST_TIMEOUT_S)
                addrs = decode_request(payload)
                reached = await self._dial(asker, dial_targets(addrs, observed, self._own_slots(asker)))
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

    def _take(self, group: str) -> str:
        """Why a request from `group` is refused now ("" if it is served: then it is counted)."""
        if self.busy.total() >= MAX_CONCURRENT or self.busy[group] >= MAX_PER_GROUP:
            return f"{self.busy.total()} dial-backs running"
        if not self.rates.take(group, time.monotonic()):
            return f"{group} asked more than {GROUP_PER_MINUTE} dial-backs per minute"
        self.busy[group] += 1
        return ""

    async def _observed(self, asker: str) -> set[str]:
        """The IPs the asker's connections to this node come from."""
        for info in await self.p2p.list_peers():
            if info.peer_id.to_base58() == asker:
                return {a.ip for a in (tcp_addr(str(m)) for m in info.addrs) if a is not None}
        return set()

    def _own_slots(self, asker: str) -> dict[int, str]:
        """The port of the slot this node's relay holds for `asker` -> where to dial it here."""
        slot = self.relay.slots.get(asker) if self.relay is not None else None
        if slot is None or slot.server is None or not slot.server.sockets:
            return {}
        host = self.relay.host
        local = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        return {slot.server.sockets[0].getsockname()[1]: local}

    async def _dial(self, asker: str, targets: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
        """(asked, reported) for each target a stranger's host reached the asker at, one at a time,
        within DIAL_BUDGET_S in all."""
        reached: list[tuple[str, str]] = []
        deadline = time.monotonic() + DIAL_BUDGET_S
        for asked, target, reported in targets:
            left = min(DIAL_TIMEOUT_S, deadline - time.monotonic())
            if left <= 0:
                break
            if await self.pool.probe(asker, target, left):
                reached.append((asked, reported))
        return reached

    async def close(self) -> None:
        await self.pool.close()


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
    relay slots (swarm/nat/port_relay.py). Returns the relay (None without `limits`), for close;
    the dial-backs' idle prober daemons exit with this process (probers.py)."""
    from functools import partial

    from hexswarm.swarm.nat.port_relay import RELAY_PROTOCOL, RelayService

    relay = None
    if limits is not None:
        relay = RelayService(limits=limits, group_of=partial(ip_group_of, p2p))
        await relay.start()
        await p2p.add_binary_stream_handler(RELAY_PROTOCOL, relay.handle_stream)
    await p2p.add_binary_stream_handler(DIALBACK_PROTOCOL, DialBackService(p2p, relay).handle_stream)
    return relay
