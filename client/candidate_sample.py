"""A bounded sample of candidates per block in front of the router: the peers a client pings.

A client measures its round trip to every peer it may route through before it routes (a PING,
re-measured after a minute). At 300 peers of a model that is 300 dials for each fresh
`generate()`, and through relays those connections stay open and hold the relays' slots.
So the router sees at most `per_block` records serving any block: those whose
round trip the client measured within the minute first (no new dial), then a draw that is
random per client and changes each minute (`seed`, `epoch`), so that clients spread their load
and new peers get their turn. A peer is kept while any block it serves has fewer than
`per_block`; a block served by fewer keeps them all. The dials a fresh client makes are then at
most about `per_block` × blocks ÷ (blocks a peer serves), whatever the swarm's size.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Sequence

from hexswarm.swarm.trust.records import PeerRecord

CANDIDATES_PER_BLOCK = 8  # 0 turns the sample off


def sample_per_block(
    records: Sequence[PeerRecord], per_block: int, measured: Collection[str], seed: bytes, epoch: int = 0
) -> list[PeerRecord]:
    """`records` with at most about `per_block` serving each block (module docstring), in their
    original order; `measured`: peers whose round trip the client knows and may reuse."""
    if per_block <= 0:
        return list(records)
    held: Counter[int] = Counter()
    kept: set[str] = set()
    key = seed + epoch.to_bytes(8, "big")
    for record in sorted(records, key=lambda r: (r.peer_id not in measured, _draw(key, r.peer_id))):
        blocks = range(record.start, record.end)
        if record.peer_id in kept or all(held[b] >= per_block for b in blocks):
            continue
        kept.add(record.peer_id)
        held.update(blocks)
    return [r for r in records if r.peer_id in kept]


def _draw(key: bytes, peer_id: str) -> bytes:
    return hashlib.blake2b(peer_id.encode(), key=key[:64], digest_size=8).digest()
