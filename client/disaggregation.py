"""Disaggregated prefill and decode, the client's part: which peers compute a request's prompt,
which decode it, and where each prompt layer's keys and values go.

HexGen-2 (§1, §3) separates the two phases of a request: a prompt is compute-bound and a decode
step memory-bound, so a long prompt on the same peer stalls every decode step behind it. A peer
started with `--role prefill` computes prompts only; its sessions send each layer's keys and
values straight to the decode peer serving that layer (peer/server.py, swarm/wire/protocol.py
KV_PUSH), and the request decodes on `--role decode` (or `both`) peers from the prompt's length
on. The client still sees one generate(): client/session.py runs the prompt through the prefill
chain, then every later step through the decode chain, and serves the request colocated if
the disaggregated path fails before decoding starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexswarm.client.hop_links import LiveHop
from hexswarm.client.swarm_client import uncovered_blocks
from hexswarm.routing.chains.swarm_view import Route
from hexswarm.swarm.trust.records import PeerRecord
from hexswarm.swarm.wire.protocol import KvTarget


@dataclass(frozen=True)
class Roles:
    """The peers that may compute a request's prompt, and those that may decode it."""

    prefill: list[PeerRecord]
    decode: list[PeerRecord]


def split_by_role(records: list[PeerRecord], num_blocks: int) -> Roles | None:
    """The swarm's peers by phase, when it can serve requests disaggregated: some peers announce
    `prefill`, the prefill peers cover every block, and so do the decode (or `both`) peers.
    Keys and values move between whole layers only, so tensor-parallel peers stay out."""
    prefill = [r for r in records if r.role == "prefill" and r.tp == 1]
    decode = [r for r in records if r.role in ("decode", "both") and r.tp == 1]
    if not prefill or uncovered_blocks(prefill, num_blocks) or uncovered_blocks(decode, num_blocks):
        return None
    return Roles(prefill, decode)


def kv_sources(start: int, end: int, prefill: Route) -> tuple[str, ...]:
    """The prefill peers whose hops overlap blocks [start, end): whom a decode session takes
    keys and values from."""
    return tuple(dict.fromkeys(h.peer_id for h in prefill.hops if h.start < end and start < h.end))


def kv_targets(start: int, end: int, decode: list[LiveHop]) -> tuple[KvTarget, ...]:
    """Where the keys and values of a prefill hop over blocks [start, end) go: for each decode
    hop it overlaps, that hop's peer, session and the shared blocks."""
    return tuple(
        KvTarget(hop.hop.peer_id, hop.session_id, max(start, hop.start), min(end, hop.end))
        for hop in decode
        if hop.start < end and start < hop.end
    )
