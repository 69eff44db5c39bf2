"""A peer's first step, taken before its model code loads: its identity and its DHT node.

Loading the model code (torch, transformers, the peer's modules) takes a peer 2-3 s; joining
the DHT (a forked child process that starts p2pd and reaches the initial peers) takes another
0.5 s or more. `start_joining` forks the node without waiting for it, so it joins while the
parent imports and reads the model; `serve` (peer/runtime.py) then waits for it.

The fork also happens before the model code loads, so the DHT child carries none of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexswarm.swarm.net.dht import start_dht, wait_until_joined
from hexswarm.swarm.net.dht_process import shutdown_dht
from hexswarm.swarm.net.identity import Identity, load_or_create_identity

JOIN_TIMEOUT_S = 30.0  # as start_dht's own wait
ABANDON_TIMEOUT_S = 5.0  # shutting down a node the peer will not serve on (a usage error)
DHT_CLOSE_S = 2.5  # a serving peer's node gets this long to stop (then it is killed, p2pd with it)


@dataclass
class Joining:
    """A DHT node on its way into the swarm, and the identity it signs with."""

    identity: Identity
    dht: Any  # hexswarm.swarm.net.dht_process.OwnedDHT
    initial_peers: tuple[str, ...]

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
) -> Joining:
    """Loads (or creates) the identity and forks the DHT node, without waiting for it to join.
    Raises InitialPeersError at once for a malformed initial peer."""
    identity = load_or_create_identity(identity_path)
    dht = start_dht(initial_peers, identity, host_maddrs, announce_maddrs, await_ready=False)
    return Joining(identity, dht, initial_peers)
