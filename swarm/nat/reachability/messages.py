"""Dial-backs: can others open a connection to me, directly or through a relay?

A peer asks a few reachable nodes (bootstraps first) on DIALBACK_PROTOCOL to dial it back at
the addresses it lists: its own, or the ports relays hold for it (swarm/nat/port_relay.py). Each helper dials from a fresh libp2p host of its own (a short-lived
p2pd with no listening address and no prior connection), so a success proves that a
stranger can open a connection to the asker and complete libp2p's handshake with its key;
the asker's existing connection to the helper proves nothing. No central web service and no
address ranges decide it (a home network and the tests' "internet" both use private ranges).

The helper never becomes a tool to dial arbitrary hosts: an address is dialed at the IP address
the asker's own connection comes from (with each port it names, so that a forwarded port is
found), or as it is when its IP is that of a node this helper is connected to (a relay's port).
Requests are small, bounded and few at a time.

This module is the protocol both sides share: its limits and its messages. The helper's side is
service.py, the asker's client.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from hexswarm.swarm.net.maddrs import MAX_MADDR_CHARS, tcp_addr
from hexswarm.swarm.trust.records import unpack_map

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
