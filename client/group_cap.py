"""At most a few records per IP group per block in front of a router.

Identities cost nothing, so one machine can announce twenty peers of the same blocks, each
claiming to be fast, and crowd every honest peer out of a client's routes (and make it ping all
twenty). A router therefore sees at most `limit` records of one IP group (a /24 or /48 of a
record's addresses: swarm/net/maddrs.py `ip_group`) for any block: libp2p's DHT diversity filter,
applied to routing.

Which records of a crowded group a client sees is drawn at random per client (`seed`), so
different clients spread their load over all of a group's peers, and announcing better figures
does not buy a place. Loopback addresses have no group: a swarm on one machine is one operator's.
A relayed peer counts under the group its own record says its dial-back helpers saw (signed by
the peer itself, so a liar can claim another group: the cap is weaker for relayed peers than
for direct ones, whose addresses are dialed).
A block that the cap would leave unserved gets its capped records back, so the cap never makes a
request fail that would have run.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections import Counter
from collections.abc import Sequence

from hexswarm.swarm.net.maddrs import ip_group, tcp_addr
from hexswarm.swarm.trust.records import PeerRecord

RECORDS_PER_GROUP = 4  # per block; 0 turns the cap off (a private swarm behind one address)


def record_groups(record: PeerRecord | None) -> set[str]:
    """The IP groups a record's addresses are in (peers behind one address may be one operator)."""
    addrs = [tcp_addr(a) for a in (record.addrs if record else ())]
    return {ip_group(a.ip) for a in addrs if a is not None}


def routable_groups(record: PeerRecord) -> set[str]:
    """The groups a record counts under for routing: its addresses' groups, loopback left out;
    for a relayed peer, whose addresses are its relays', the group its dial-back helpers saw it
    connect from (else twenty homes relayed by two bootstraps would count as the bootstraps')."""
    if record.reachability == "relayed" and record.observed_group:
        groups = {record.observed_group}
    else:
        groups = record_groups(record)
    return {g for g in groups if not ipaddress.ip_network(g, strict=False).is_loopback}


def cap_per_group(records: Sequence[PeerRecord], limit: int, seed: bytes) -> list[PeerRecord]:
    """`records` with at most `limit` of any one IP group serving each block (module docstring),
    in their original order."""
    if limit <= 0:
        return list(records)
    held: Counter[tuple[str, int]] = Counter()
    kept: set[str] = set()
    for record in sorted(records, key=lambda r: _draw(seed, r.peer_id)):
        groups = routable_groups(record)
        blocks = range(record.start, record.end)
        if any(held[g, b] >= limit for g in groups for b in blocks):
            continue
        kept.add(record.peer_id)
        held.update((g, b) for g in groups for b in blocks)
    kept |= _restoring_coverage(records, kept, seed)
    return [r for r in records if r.peer_id in kept]


def _restoring_coverage(records: Sequence[PeerRecord], kept: set[str], seed: bytes) -> set[str]:
    """Capped records to add back so that every block served by `records` stays served."""
    served = {b for r in records if r.peer_id in kept for b in range(r.start, r.end)}
    added: set[str] = set()
    for record in sorted(records, key=lambda r: _draw(seed, r.peer_id)):
        blocks = set(range(record.start, record.end))
        if record.peer_id not in kept and not blocks <= served:
            added.add(record.peer_id)
            served |= blocks
    return added


def _draw(seed: bytes, peer_id: str) -> bytes:
    return hashlib.blake2b(peer_id.encode(), key=seed[:64], digest_size=8).digest()
