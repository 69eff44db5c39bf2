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
