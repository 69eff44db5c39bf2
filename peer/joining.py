"""A peer's first step, taken before its model code loads: its identity and its DHT node; and
finding the DHT again while it serves (`Rejoin`), when the nodes it joined through restarted.

Loading the model code (torch, transformers, the peer's modules) takes a peer 2-3 s; joining
the DHT (a forked child process that starts p2pd and reaches the initial peers) takes another
0.5 s or more. `start_joining` forks the node without waiting for it, so it joins while the
parent imports and reads the model; `serve` (peer/runtime.py) then waits for it.

The fork also happens before the model code loads, so the DHT child carries none of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hexswarm.peer.dht_mode import joins_as_client
from hexswarm.swarm.net.dht import start_dht, wait_until_joined
from hexswarm.swarm.net.dht_process import shutdown_dht
from hexswarm.swarm.net.identity import Identity, load_or_create_identity
from hexswarm.swarm.net.rejoin import contacts_from, ping_missing
from hexswarm.swarm.trust.records import PeerRecord, PeerState

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 30.0  # a peer's wait to join (swarm/net/dht.py START_TIMEOUT_S is a client's)
ABANDON_TIMEOUT_S = 5.0  # shutting down a node the peer will not serve on (a usage error)


@dataclass
class Joining:
    """A DHT node on its way into the swarm, and the identity it signs with."""

    identity: Identity
    dht: Any  # hexswarm.swarm.net.dht_process.OwnedDHT
    initial_peers: tuple[str, ...]
    client_mode: bool = False  # whether the node joined as a DHT client (peer/dht_mode.py)

    def wait(self, timeout: float = JOIN_TIMEOUT_S):
        """The node, once it has joined; InitialPeersError if no initial peer answered."""
        wait_until_joined(self.dht, self.initial_peers, timeout)
        return self.dht

    def abandon(self) -> None:
        """Stops the node: the peer will not serve (its flags were wrong)."""
        shutdown_dht(self.dht, ABANDON_TIMEOUT_S)


def start_joining(
    initial_peers: tuple[str, ...],
    identity_path: str | None,
    host_maddrs: tuple[str, ...],
    announce_maddrs: tuple[str, ...],
    client_mode: bool = False,
) -> Joining:
    """Loads (or creates) the identity and forks the DHT node, without waiting for it to join;
    `client_mode` for a peer that may be behind NAT (peer/dht_mode.py). Raises
    InitialPeersError at once for a malformed initial peer."""
    identity = load_or_create_identity(identity_path)
    dht = start_dht(
        initial_peers, identity, host_maddrs, announce_maddrs, client_mode=client_mode, await_ready=False
    )
    return Joining(identity, dht, initial_peers, client_mode)


def start_joining_for(config) -> Joining:
    """`start_joining` with a PeerConfig's flags (a peer started without peer/cli.py)."""
    client_mode = joins_as_client(config.reachability, config.host_maddrs)
    return start_joining(
        config.initial_peers, config.identity_path, config.host_maddrs, config.announce_maddrs, client_mode
    )


@dataclass
class Rejoin:
    """Each announce period (swarm/net/rejoin.py): pings the contacts missing from the node's
    routing table, the initial peers first, then direct peers of the model. While this peer's
    own record is missing from what it read, it pings every contact and says so at WARNING: a
    record nobody can read is a peer nobody routes to. When the period's announcement reached no
    node (`unstored`), it pings every contact too and announces again (`reannounce`) as soon as
    one answered, instead of a period later: a record lives 2.5 periods, so two misses in a row
    (a bootstrap that stopped, and the table that dropped the other with it) would let it lapse."""

    peer_id: str
    initial_peers: tuple[str, ...]
    reannounce: Callable[[], Awaitable[None]] | None = None
    unreadable: int = 0  # periods in a row whose read missed this peer's own record
    answered: set[str] = field(default_factory=set)  # contacts that answered the last ping
    task: asyncio.Task | None = None  # the step in flight

    def poke(self, dht, records: Sequence[PeerRecord], unstored: bool = False) -> None:
        """Starts a step in the background unless one still runs: a contact that hangs (a
        stopped bootstrap) must not hold up the peer's announce period."""
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self.step(dht, records, unstored), name="rejoin")

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def step(self, dht, records: Sequence[PeerRecord], unstored: bool = False) -> None:
        own_seen = any(r.peer_id == self.peer_id for r in records)
        self.unreadable = 0 if own_seen else self.unreadable + 1
        direct = [
            (r.peer_id, r.addrs)
            for r in records
            if r.reachability == "direct" and r.state == PeerState.ONLINE
        ]
        contacts = contacts_from(self.initial_peers, direct, self.peer_id)
        try:
            pinged, answered = await ping_missing(dht, contacts, everyone=self.unreadable > 0 or unstored)
        except Exception as e:  # a DHT process that does not answer: the next period tries again
            logger.warning("re-joining the DHT failed: %s", type(e).__name__)
            return
        if self.unreadable:
            logger.warning(
                "this peer's record was not readable in the DHT (%d announce period(s) in a row); "
                "re-joining through %d of %d known node(s) that answered",
                self.unreadable, len(answered), len(contacts),
            )  # fmt: skip
        elif set(answered) - self.answered:
            logger.info(
                "back in touch with %s (missing from the routing table)",
                ", ".join("..." + p[-8:] for p in answered),
            )
        self.answered = set(answered) if pinged else self.answered
        if unstored and answered and self.reannounce is not None:
            logger.info(
                "announcing again: %d node(s) answered after the announcement reached none", len(answered)
            )
            await self.reannounce()
