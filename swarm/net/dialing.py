"""Opening streams to peers at the addresses their signed records announce.

A peer behind NAT is reached only through a relay's port (swarm/nat/port_relay.py), and its
daemon's own idea of its addresses (home addresses, loopback) is useless to others. So every
role dials a peer at the addresses of its latest record (signed by the peer itself:
swarm/trust/dht_signing.py) before it opens a stream, and falls back to the daemon's routing when the
record names none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from hexswarm.swarm.net.maddrs import peer_id_of, tcp_addr, without_peer_id

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
MAX_DIAL_ADDRS = 8


def dialable(peer_id: str, addrs: Iterable[str]) -> tuple[str, ...]:
    """The addresses of a record worth handing the daemon: TCP ones of this very peer."""
    chosen = [a for a in addrs if tcp_addr(a) is not None and peer_id_of(a) in (None, peer_id)]
    return tuple(chosen[:MAX_DIAL_ADDRS])


class Dialer:
    """Remembers each peer's announced addresses and connects through them before a stream."""

    def __init__(self, p2p):
        self.p2p = p2p
        self.addrs: dict[str, tuple[str, ...]] = {}

    def learn(self, records: Iterable) -> None:
        """Takes the addresses of fresh records (PeerRecord or anything with peer_id and addrs)."""
        for record in records:
            addrs = dialable(record.peer_id, record.addrs)
            if addrs:
                self.addrs[record.peer_id] = addrs

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
        addrs = self.addrs.get(peer.to_base58())
        if not addrs or timeout <= 0:
            return
        try:
            from hivemind.utils.multiaddr import Multiaddr

            maddrs = [Multiaddr(without_peer_id(a)) for a in addrs]
            await asyncio.wait_for(self.p2p._client.connect(peer, maddrs), min(timeout, CONNECT_TIMEOUT_S))
        except Exception as e:
            logger.debug("dialing ...%s at %s: %s: %s", peer.to_base58()[-8:], addrs, type(e).__name__, e)
