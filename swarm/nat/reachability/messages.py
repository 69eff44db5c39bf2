"""Dial-backs: can others open a connection to me, directly or through a relay?

A peer asks a few reachable nodes (bootstraps first) on DIALBACK_PROTOCOL to dial it back at
the addresses it lists: its own, or the ports relays hold for it (swarm/nat/port_relay.py). Each helper dials from a fresh libp2p host of its own (a short-lived
p2pd with no listening address and no prior connection), so a success proves that a
stranger can open a connection to the asker and complete libp2p's handshake with its key;
the asker's existing connection to the helper proves nothing. No central web service and no
address ranges decide it (a home network and the tests' "internet" both use private ranges).

The helper never becomes a tool to dial arbitrary hosts: an address is dialed at the IP address
the asker's own connection comes from (with each port it names, so that a forwarded port is
found), or, when its port is a slot this helper's own relay holds for the asker, at that slot.
Requests are small, bounded, few at a time, and few a minute per IP group; the asker backs off
on BUSY and asks another helper.

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
MAX_CONCURRENT = 4  # requests served at once; more are refused at once, not queued
MAX_PER_GROUP = 1  # ... of which from one IP group (many identities on one machine share it)
GROUP_PER_MINUTE = 12  # requests one IP group may make a minute (bursts of 24): rechecks come
# once an announce period (15 s) per peer, and a group's silent streams hold a place 1 s each
BUSY = "busy"  # a reply's error when the helper serves others: back off, or ask another helper
BUSY_RETRY_S = 0.5  # the asker's first wait after BUSY, doubling
BUSY_TRIES = 3  # then it asks another helper (up to MAX_SPARES others), from another IP group first
MAX_SPARES = 3
REQUEST_TIMEOUT_S = 1.0  # to read a request: the asker sends it at once, so a silent one is a jammer
DIAL_TIMEOUT_S = 3.0  # per address
DIAL_BUDGET_S = 6.0  # all of one request's dials: one request holds a place at most this long
PROBER_START_S = 10.0
ASK_TIMEOUT_S = 4.0 + PROBER_START_S / 2 + DIAL_BUDGET_S  # the asker's wait for one helper


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
    pairs = tuple(p for p in map(_pair, reached) if _fits(p, asked, observed))
    return DialBackReply(helper, pairs, observed, error[:200])


def _pair(item) -> tuple[str, str]:
    if not (isinstance(item, list) and len(item) == 2 and all(isinstance(a, str) for a in item)):
        raise ValueError("each reached entry must be [asked, dialed]")
    return item[0], item[1]


def _fits(pair: tuple[str, str], asked: Sequence[str], observed_ip: str = "") -> bool:
    """A reached address we asked about, dialed at the port we named (our own listening or
    announced port) and at the IP we named or the one the helper says it saw us at: a helper
    cannot name an address of its choosing."""
    asked_addr, dialed = pair
    if asked_addr not in asked:
        return False
    mine, theirs = tcp_addr(asked_addr), tcp_addr(dialed)
    if mine is None or theirs is None or mine.port != theirs.port:
        return False
    return theirs.ip in (mine.ip, observed_ip)
