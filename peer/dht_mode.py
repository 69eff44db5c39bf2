"""Which mode a peer's DHT node runs in: a client (it stores nothing for others and is in no
one's routing table) until others can dial it, then a server.

A node that joins as a server is put in the routing tables of the nodes it talks to. A peer
behind NAT that joined so, then found that nobody could dial it and restarted as a client
(peer/reachability.py), stayed in those tables under its id at an address nobody can reach:
the next search that asked it waited out a dial. In benchmarks/scale.py a fresh client's first
search waited 5 s on the newcomer behind NAT that had just joined, and a public swarm has one
such entry per peer behind NAT. So a peer that may be behind NAT joins as a client, and only
a peer that the dial-back found direct restarts its node as a server, on the ports the
dial-back reached (go-libp2p's Kademlia does the same: a node serves the DHT once AutoNAT finds
it reachable).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from hexswarm.swarm.net.dht import start_dht
from hexswarm.swarm.net.dht_process import shutdown_dht
from hexswarm.swarm.net.maddrs import is_loopback, tcp_addr

DHT_CLOSE_S = 2.5  # a serving peer's node gets this long to stop (then it is killed, p2pd with it)


def joins_as_client(reachability: str, host_maddrs: Sequence[str]) -> bool:
    """Whether a peer joins the DHT as a client first: unless it is told it is direct, or it
    listens on loopback only (it serves this machine, where everyone can dial it)."""
    loopback_only = bool(host_maddrs) and all(is_loopback(m) for m in host_maddrs)
    return reachability != "direct" and not loopback_only


def pinned_ports(host_maddrs: Sequence[str], listen: Sequence[str]) -> tuple[str, ...]:
    """`host_maddrs` with each port 0 replaced by the port the node got for that IP version
    (from `listen`, its addresses): a node started on them again listens where it did."""
    ports: dict[str, int] = {}
    for addr in map(tcp_addr, listen):
        if addr is not None:
            ports.setdefault("ip6" if ":" in addr.ip else "ip4", addr.port)
    pinned = []
    for maddr in host_maddrs:
        parts = maddr.split("/")
        if len(parts) >= 5 and parts[3] == "tcp" and parts[4] == "0" and parts[1] in ports:
            parts[4] = str(ports[parts[1]])
        pinned.append("/".join(parts))
    return tuple(pinned)


def restarter(config, identity, dht) -> Callable[..., Awaitable]:
    """`restart(client_mode, listen=())`: shuts `dht` down and starts the peer's node again, as
    a client, or as a server on the ports of `listen`. No check that the identity is free: this
    process held it a moment ago (hivemind's check could still see the old node connected)."""
    held = dataclasses.replace(identity, fresh=True)

    async def restart(client_mode: bool, listen: Sequence[str] = ()):
        await asyncio.to_thread(shutdown_dht, dht, DHT_CLOSE_S)
        if client_mode:
            return start_dht(config.initial_peers, held, config.host_maddrs, client_mode=True)
        maddrs = pinned_ports(config.host_maddrs, listen)
        return start_dht(config.initial_peers, held, maddrs, config.announce_maddrs)

    return restart
