"""The bounded sample of candidates a client pings and routes through (client/candidate_sample.py)."""

from __future__ import annotations

from collections import Counter

from hexswarm.client.candidate_sample import sample_per_block
from hexswarm.client.swarm_client import SwarmClient
from tests.unit.record_cases import make_record

SEED = b"0123456789abcdef"


def swarm_of(count: int, blocks: int = 10, span: int = 2) -> list:
    return [make_record(peer_id=f"Qm{i:03d}", start=i % (blocks - span + 1), end=i % (blocks - span + 1) + span)
            for i in range(count)]  # fmt: skip


def per_block(records) -> Counter:
    return Counter(b for r in records for b in range(r.start, r.end))


def test_a_small_swarm_is_kept_whole():
    records = swarm_of(12)
    assert sample_per_block(records, 8, set(), SEED) == records
    assert sample_per_block(swarm_of(300), 0, set(), SEED) == swarm_of(300)  # 0: off


def test_a_big_swarm_is_cut_to_a_few_per_block_and_every_block_stays_served():
    records = swarm_of(300)
    kept = sample_per_block(records, 8, set(), SEED)
    served, everyone = per_block(kept), per_block(records)
    assert set(served) == set(everyone)
    # a peer kept for a block still short counts on its other block too
    assert all(8 <= served[b] < 2 * 8 for b in everyone)
    assert len(kept) <= 8 * 10 // 2 + 10 and len(kept) < len(records) // 5
    assert [r for r in records if r in kept] == kept  # in their original order


def test_measured_peers_come_first_and_the_draw_changes_with_the_epoch():
    records = swarm_of(300)
    measured = {r.peer_id for r in records[:40]}
    kept = {r.peer_id for r in sample_per_block(records, 8, measured, SEED)}
    assert len(kept & measured) >= 30
    first, later = ({r.peer_id for r in sample_per_block(records, 8, set(), SEED, epoch)} for epoch in (1, 2))
    assert first != later
    assert first == {r.peer_id for r in sample_per_block(records, 8, set(), SEED, 1)}


def test_a_block_whose_sampled_peers_are_silent_is_sampled_again(monkeypatch):
    client = SwarmClient(dht=None, p2p=None, dialer=object(), candidates_per_block=4)
    records = swarm_of(60, blocks=2, span=2)  # everyone serves both blocks
    pinged: list[list[str]] = []

    def round_trips(sample, timeout=0):  # the first sample all stays silent, the next answers
        pinged.append([r.peer_id for r in sample])
        return {r.peer_id: 10.0 for r in sample} if len(pinged) > 1 else {}

    monkeypatch.setattr(client, "round_trips", round_trips)
    rtts = client.sampled_round_trips(records)
    assert [len(batch) for batch in pinged] == [4, 4]
    assert not set(pinged[0]) & set(pinged[1]) and set(rtts) == set(pinged[1])


def _shard_reader(records):
    """A `read_shards` over `records` that keeps the shards each call asked for."""
    from hexswarm.swarm.trust.record_keys import record_shard

    calls: list[list[int]] = []

    def read(shards: list[int]) -> list:
        calls.append(shards)
        return [r for r in records if record_shard(r.peer_id) in shards]

    return read, calls


def test_a_big_swarm_is_read_a_few_shards_at_a_time_and_a_small_one_whole():
    from hexswarm.client.candidate_sample import FIRST_SHARDS, ShardReads
    from hexswarm.swarm.trust.record_keys import RECORD_SHARDS

    big, calls = _shard_reader(swarm_of(3000))
    reads = ShardReads(SEED, per_block=16)
    got = reads.read(big, 10, epoch=1)
    assert [len(c) for c in calls] == [FIRST_SHARDS] and min(per_block(got).values()) >= 16
    assert len(got) < 3000 // 4  # a few shards' worth, not the swarm

    small, calls = _shard_reader(swarm_of(12))
    reads = ShardReads(SEED, per_block=16)
    assert sorted(r.peer_id for r in reads.read(small, 10, epoch=1)) == sorted(
        r.peer_id for r in swarm_of(12)
    )
    assert [len(c) for c in calls] == [FIRST_SHARDS, RECORD_SHARDS - FIRST_SHARDS]
    reads.read(small, 10, epoch=2)  # it remembers that only every shard serves: one read of all
    assert [len(c) for c in calls[2:]] == [RECORD_SHARDS]
    assert ShardReads(SEED, per_block=0).read(small, 10, epoch=1) and len(calls[-1]) == RECORD_SHARDS


def test_shards_are_read_in_an_order_of_the_clients_own_that_changes_each_epoch():
    from hexswarm.client.candidate_sample import ShardReads

    read, calls = _shard_reader(swarm_of(3000))
    ShardReads(SEED, 16).read(read, 10, epoch=1)
    ShardReads(SEED, 16).read(read, 10, epoch=2)
    ShardReads(b"another client's", 16).read(read, 10, epoch=1)
    assert len({tuple(c) for c in calls}) == 3
