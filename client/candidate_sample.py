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

What it samples from is bounded too (`ShardReads`): a model's records are spread over
RECORD_SHARDS keys by peer id (swarm/trust/record_keys.py), each a random slice of the swarm, so
a client reads them in an order of its own, a few first, and the rest only when some block is
still served by fewer than `per_block` usable records (READS_PER_CANDIDATE × CANDIDATES_PER_BLOCK). In a test swarm of a few peers that is
every shard, read at once after the first time; at 300 peers about a quarter of them.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from hexswarm.swarm.trust.record_keys import RECORD_SHARDS, record_shard
from hexswarm.swarm.trust.records import PeerRecord

CANDIDATES_PER_BLOCK = 8  # 0 turns the sample off
FIRST_SHARDS = 4  # shards read first from a swarm this client has not read before
READS_PER_CANDIDATE = 2  # usable records read per sampled candidate: room for silent peers


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


@dataclass
class ShardReads:
    """Which of a model's record shards a client reads (module docstring): its own order, which
    changes each epoch; first as many as sufficed last time (FIRST_SHARDS before any read), then
    the rest if some block is still short of `per_block` usable records."""

    seed: bytes
    per_block: int
    first: int = FIRST_SHARDS

    def read(
        self, read_shards: Callable[[list[int]], list[PeerRecord]], num_blocks: int, epoch: int
    ) -> list[PeerRecord]:
        """The records `read_shards(shards)` returns (the usable ones) over enough shards."""
        if self.per_block <= 0:
            return read_shards(list(range(RECORD_SHARDS)))
        order = sorted(
            range(RECORD_SHARDS), key=lambda shard: _draw(self.seed + epoch.to_bytes(8, "big"), str(shard))
        )
        records = read_shards(order[: self.first])
        if self.first < RECORD_SHARDS and not _enough(records, num_blocks, self.per_block):
            records += read_shards(order[self.first :])
        self.first = max(FIRST_SHARDS, _shards_needed(records, order, num_blocks, self.per_block))
        return records


def _enough(records: Sequence[PeerRecord], num_blocks: int, per_block: int) -> bool:
    held: Counter[int] = Counter()
    for record in records:
        held.update(range(record.start, record.end))
    return all(held[block] >= per_block for block in range(num_blocks))


def _shards_needed(records: Sequence[PeerRecord], order: list[int], num_blocks: int, per_block: int) -> int:
    """How many shards of `order`, read first, would have held `per_block` records of each
    block: all of them where even every shard does not. One pass over the records, a shard at a
    time in `order` (each record's shard hashed once)."""
    by_shard: dict[int, list[PeerRecord]] = {}
    for record in records:
        by_shard.setdefault(record_shard(record.peer_id), []).append(record)
    held: Counter[int] = Counter()
    short = set(range(num_blocks))
    for count, shard in enumerate(order, start=1):
        for record in by_shard.get(shard, ()):
            for block in range(record.start, min(record.end, num_blocks)):
                held[block] += 1
                if held[block] >= per_block:
                    short.discard(block)
        if not short:
            return count
    return RECORD_SHARDS


def _draw(key: bytes, peer_id: str) -> bytes:
    return hashlib.blake2b(peer_id.encode(), key=key[:64], digest_size=8).digest()
