"""Finding the swarm again after the nodes a DHT node joined through restart or die.

hivemind pings the initial peers once, when a node starts, and drops a node from its routing
table when a call to it fails. A bootstrap that stops is dropped by everyone; when it comes back
(same identity, same address) it knows nobody, and nobody dials it again: a client that joins
through it reads an empty swarm while every peer still serves (docs/operations.md, "Running the
bootstraps").

So a serving peer, each announce period, pings the contacts it knows (its initial peers, then
direct peers of its model from the records it read) that are missing from its routing table.
hivemind's ping carries the caller's node info, so a server-mode caller is put back in the
contact's table too, and a restarted bootstrap learns the swarm from the first peers that find
it. When every contact is in the table the step pings nobody: a healthy swarm pays one look at
a dictionary per period.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from hexswarm.swarm.net.maddrs import peer_id_of, tcp_addr, without_peer_id

MAX_CONTACTS = 8  # pinged at most per step: the initial peers first
PING_TIMEOUT_S = 5.0  # a contact's dial and ping, each
STEP_TIMEOUT_S = 15.0  # the whole step, waited on from the peer's event loop


@dataclass(frozen=True)
class Contact:
    """A node to find the DHT through: its peer id and the TCP addresses to dial it at."""

    peer_id: str
    addrs: tuple[str, ...]


def contacts_from(
    initial_peers: Sequence[str], others: Sequence[tuple[str, Sequence[str]]], own_id: str
) -> list[Contact]:
    """The initial peers, then `others` ((peer id, addresses), e.g. direct peers' records), one
    contact per peer id and never this node itself; at most MAX_CONTACTS."""
    found: dict[str, list[str]] = {}
    for addr in initial_peers:
        peer = peer_id_of(addr)
        if peer and tcp_addr(addr):
            found.setdefault(peer, []).append(addr)
    for peer, addrs in others:
        if peer not in found:
            found[peer] = [a for a in addrs if tcp_addr(a) and peer_id_of(a) in (None, peer)]
    chosen = [Contact(p, tuple(a)) for p, a in found.items() if p != own_id and a]
    return chosen[:MAX_CONTACTS]


async def ping_missing(
    dht, contacts: Sequence[Contact], everyone: bool = False
) -> tuple[list[str], list[str]]:
    """(pinged, answered): peer ids of the contacts missing from `dht`'s routing table (all of
    them with `everyone`) that were pinged, and those that answered (and are in the table now)."""
    wanted = tuple((c.peer_id, c.addrs) for c in contacts)
    future = dht.run_coroutine(partial(_ping_in_node, wanted, everyone), return_future=True)
    return await asyncio.wait_for(asyncio.wrap_future(future), STEP_TIMEOUT_S)


async def _ping_in_node(wanted, everyone: bool, _dht, node) -> tuple[list[str], list[str]]:
    """Runs in the DHT's own process (hivemind's DHT.run_coroutine)."""
    from hivemind.p2p import PeerID
    from hivemind.utils.multiaddr import Multiaddr

    table = node.protocol.routing_table
    missing = [(p, a) for p, a in wanted if everyone or PeerID.from_base58(p) not in table]

    async def ping(peer_text: str, addrs: tuple[str, ...]) -> bool:
        peer = PeerID.from_base58(peer_text)
        try:  # the daemon may have forgotten the address of a node that was gone for a while
            maddrs = [Multiaddr(without_peer_id(a)) for a in addrs]
            await asyncio.wait_for(node.p2p._client.connect(peer, maddrs), PING_TIMEOUT_S)
        except Exception:  # the ping below says whether it answers
            pass
        try:
            return await asyncio.wait_for(node.protocol.call_ping(peer), PING_TIMEOUT_S) is not None
        except Exception:
            return False

    answers = await asyncio.gather(*(ping(p, a) for p, a in missing))
    return [p for p, _ in missing], [p for (p, _), ok in zip(missing, answers, strict=True) if ok]
