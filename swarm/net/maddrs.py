"""Multiaddrs as the public swarm uses them: direct TCP addresses with a peer id."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

MAX_MADDR_CHARS = 256


@dataclass(frozen=True)
class TcpAddr:
    """The host and port of a /ip4|ip6/.../tcp/... address."""

    ip: str
    port: int


def tcp_addr(maddr: str) -> TcpAddr | None:
    """The (ip, port) an address names, or None if it is not /ip4|ip6/X/tcp/P[/p2p/ID]."""
    parts = maddr.split("/")
    if len(maddr) > MAX_MADDR_CHARS or len(parts) < 5 or parts[0] != "":
        return None
    if parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
        return None
    if len(parts) > 5 and not (len(parts) == 7 and parts[5] == "p2p"):
        return None
    try:
        ip = str(ipaddress.ip_address(parts[2]))
        port = int(parts[4])
    except ValueError:
        return None
    return TcpAddr(ip, port) if 0 < port < 65536 else None


def is_loopback(maddr: str) -> bool:
    """Whether `maddr` is an address on a loopback IP (any transport or port: a listen address
    with port 0 included)."""
    parts = maddr.split("/")
    if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return False
    try:
        return ipaddress.ip_address(parts[2]).is_loopback
    except ValueError:
        return False


def peer_id_of(maddr: str) -> str | None:
    """The /p2p/<id> an address ends with (whose address it is), or None."""
    _, found, tail = maddr.rpartition("/p2p/")
    return tail if found and tail and "/" not in tail else None


def without_peer_id(maddr: str) -> str:
    """The address to hand the daemon for a known peer: without its trailing /p2p/<id> (hivemind
    encodes that part as a CID, which p2pd cannot parse)."""
    head, found, tail = maddr.rpartition("/p2p/")
    return head if found and tail and "/" not in tail else maddr


def with_peer_id(maddr: str, peer_id: str) -> str:
    return f"{without_peer_id(maddr)}/p2p/{peer_id}"


def ip_group(ip: str) -> str:
    """The network one operator is likely to hold whole (/24 of IPv4, /48 of IPv6): what limits
    per IP group count, so that many identities on one machine share one allowance."""
    address = ipaddress.ip_address(ip)
    prefix = 24 if address.version == 4 else 48
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


EXAMPLE_INITIAL_PEER = "/ip4/203.0.113.7/tcp/31337/p2p/QmYourBootstrapsPeerId"


def initial_peer_problem(text: str) -> str | None:
    """Why `text` cannot be an initial peer (None if it can): a multiaddr that starts with "/"
    and names the peer with /p2p/<id>, as `hexswarm bootstrap` prints it."""
    parts = text.split("/")
    if not text.startswith("/") or len(parts) < 3 or "" in parts[1:]:
        return f"{text!r} is not a multiaddr: an initial peer looks like {EXAMPLE_INITIAL_PEER} (what `hexswarm bootstrap` prints)"
    if "p2p" not in parts and "ipfs" not in parts:
        return f"{text!r} names no peer: add /p2p/<its peer id>, as in {EXAMPLE_INITIAL_PEER}"
    return None
