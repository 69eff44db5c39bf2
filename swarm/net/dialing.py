"""Opening streams to peers at the addresses their signed records announce.

A peer behind NAT is reached only through a relay's port (swarm/nat/port_relay.py), and its
daemon's own idea of its addresses (home addresses, loopback) is useless to others. So every
role dials a peer at the addresses of its latest record (signed by the peer itself:
swarm/trust/dht_signing.py) before it opens a stream, and falls back to the daemon's routing when the
record names none.

A record is its peer's own word, and its addresses may name anyone's host (a victim's web
server): every client that dialed them would be the liar's reflector. So a dialer bounds what
one record can make it dial (`dialable`, `Dialer.connect`):
- only TCP addresses that carry the record's own peer id (/p2p/<id>): libp2p's handshake checks
  that id, so a connection to anyone else fails after one TCP connect;
- at most MAX_DIAL_ADDRS of them per record;
- a dialer on the public internet (`private_ok` False: its initial peers are public) skips
  private, loopback, link-local, unspecified and multicast addresses: no stranger's record
  points it into its own LAN;
- an address whose dial failed is not dialed again for that peer for BACKOFF_S, doubling up to
  MAX_BACKOFF_S, until a dial succeeds.
So one lying record costs a victim at most MAX_DIAL_ADDRS connects per client per back-off period.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Iterable

from hexswarm.swarm.net.maddrs import peer_id_of, tcp_addr, without_peer_id

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
MAX_DIAL_ADDRS = 4  # a direct peer has one or two; a relayed one a port on each of its relays
BACKOFF_S = 10.0  # a failed (peer, address) is not dialed again for this long, doubling
MAX_BACKOFF_S = 600.0
MAX_BACKOFFS = 4096  # (peer, address) pairs remembered; the oldest is forgotten first


def is_public(ip: str) -> bool:
    """Whether an IP may be a stranger's host on the internet (not this side of anyone's NAT)."""
    address = ipaddress.ip_address(ip)
    return not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_unspecified
        or address.is_multicast
    )


def private_ok(initial_peers: Iterable[str]) -> bool:
    """Whether a node that joined through `initial_peers` may dial records' private addresses:
    unless every initial peer it names by IP is public (a public swarm), it is on their network."""
    ips = [a.ip for a in map(tcp_addr, initial_peers) if a is not None]
    return not ips or not all(is_public(ip) for ip in ips)


def dialable(peer_id: str, addrs: Iterable[str], private: bool = True) -> tuple[str, ...]:
    """The addresses of a record worth handing the daemon: TCP ones that carry this very peer's
    id, public ones only unless `private`; the first MAX_DIAL_ADDRS of them."""
    chosen = []
    for maddr in addrs:
        addr = tcp_addr(maddr)
        if addr is None or peer_id_of(maddr) != peer_id:
            continue
        if private or is_public(addr.ip):
            chosen.append(maddr)
    return tuple(chosen[:MAX_DIAL_ADDRS])


class Dialer:
    """Remembers each peer's announced addresses and connects through them before a stream,
    backing off from addresses whose dial failed."""

    def __init__(self, p2p, private_ok: bool = True, clock: Callable[[], float] = time.monotonic):
        self.p2p = p2p
        self.private_ok = private_ok  # False on the public internet: records' LAN addresses are skipped
        self.clock = clock
        self.addrs: dict[str, tuple[str, ...]] = {}
        self.backoff: dict[tuple[str, str], tuple[float, float]] = {}  # (peer, addr) -> (until, delay)

    def learn(self, records: Iterable) -> None:
        """Takes the addresses of fresh records (PeerRecord or anything with peer_id and addrs)."""
        for record in records:
            addrs = dialable(record.peer_id, record.addrs, self.private_ok)
            if addrs:
                self.addrs[record.peer_id] = addrs

    def due(self, peer_id: str) -> tuple[str, ...]:
        """`peer_id`'s addresses that are not backing off now."""
        now = self.clock()
        return tuple(
            a for a in self.addrs.get(peer_id, ()) if self.backoff.get((peer_id, a), (now, 0.0))[0] <= now
        )

    def failed(self, peer_id: str, addrs: Iterable[str]) -> None:
        """Backs off from `addrs` of `peer_id`: BACKOFF_S at first, doubling up to MAX_BACKOFF_S."""
        now = self.clock()
        for addr in addrs:
            _, delay = self.backoff.pop((peer_id, addr), (now, BACKOFF_S / 2))
            delay = min(2 * delay, MAX_BACKOFF_S)
            self.backoff[(peer_id, addr)] = (now + delay, delay)
        while len(self.backoff) > MAX_BACKOFFS:
            del self.backoff[next(iter(self.backoff))]

    async def open_stream(self, peer_id: str, protocol: str):
        """(reader, writer) of a new stream to `peer_id` on `protocol`."""
        from hivemind.p2p import PeerID

        peer = PeerID.from_base58(peer_id)
        await self.connect(peer)
        _, reader, writer = await self.p2p.call_binary_stream_handler(peer, protocol)
        return reader, writer

    async def connect(self, peer, timeout: float = CONNECT_TIMEOUT_S) -> None:
        """Dials the record's addresses, for at most `timeout` seconds; a no-op in the daemon
        when a connection is already open. A failure is left to the stream, which then says why
        (and may still find a route)."""
        peer_id = peer.to_base58()
        addrs = self.due(peer_id)
        if not addrs or timeout <= 0:
            return
        try:
            from hivemind.utils.multiaddr import Multiaddr

            maddrs = [Multiaddr(without_peer_id(a)) for a in addrs]
            await asyncio.wait_for(self.p2p._client.connect(peer, maddrs), min(timeout, CONNECT_TIMEOUT_S))
        except Exception as e:
            self.failed(peer_id, addrs)
            logger.debug("dialing ...%s at %s: %s: %s", peer_id[-8:], addrs, type(e).__name__, e)
        else:
            for addr in addrs:
                self.backoff.pop((peer_id, addr), None)
