"""A reader's period reads of the swarm's records (swarm/trust/record_window.py): a window of
shards a period, the rest as last read, the first read whole."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

from hexswarm.swarm.net.identity import load_or_create_identity
from hexswarm.swarm.trust.record_keys import RECORD_SHARDS, record_key, record_keys, record_shard
from hexswarm.swarm.trust.record_window import SHARDS_PER_PERIOD, RecordWindow
from hexswarm.swarm.trust.records import PeerState
from tests.unit.record_cases import make_record

MODEL = "m-1"


class Swarm:
    """The DHT as the window reads it: {record key: value} of the shards asked, or {} when down."""

    def __init__(self, count: int):
        self.peers = [load_or_create_identity(None) for _ in range(count)]
        self.asked: list[list[int]] = []
        self.down = False
        self.states: dict[str, PeerState] = {}  # peer id -> the state its record says (default ONLINE)

    async def read(self, shards: list[int]) -> dict:
        self.asked.append(shards)
        if self.down:
            return {}
        values = dict.fromkeys(record_keys(MODEL, shards))
        for identity in self.peers:
            peer_id = identity.peer_id.to_base58()
            if record_shard(peer_id) in shards:
                value = values[record_key(MODEL, peer_id)] or SimpleNamespace(value={})
                record = make_record(peer_id=peer_id, model_id=MODEL)
                if peer_id in self.states:
                    record = replace(record, state=self.states[peer_id])
                value.value[identity.owner_marker] = SimpleNamespace(value=record.to_bytes())
                values[record_key(MODEL, peer_id)] = value
        return values


def test_the_first_read_is_whole_then_a_window_a_period_sees_every_shard_in_turn():
    swarm = Swarm(12)
    window = RecordWindow(MODEL, swarm.read)
    first = asyncio.run(window.records())
    assert len(first) == 12 and swarm.asked[0] == list(range(RECORD_SHARDS))
    for _ in range(RECORD_SHARDS // SHARDS_PER_PERIOD):
        assert len(asyncio.run(window.records())) == 12  # the shards not read are held
    windows = swarm.asked[1:]
    assert all(len(shards) == SHARDS_PER_PERIOD for shards in windows)
    assert sorted(s for shards in windows for s in shards) == list(range(RECORD_SHARDS))


def test_a_peer_missing_from_its_shard_leaves_the_view_when_two_reads_in_a_row_miss_it():
    swarm = Swarm(6)
    window = RecordWindow(MODEL, swarm.read)
    asyncio.run(window.records())
    gone = swarm.peers.pop()
    for _ in range(RECORD_SHARDS // SHARDS_PER_PERIOD):  # one turn: its shard read once without it
        seen = {r.peer_id for r in asyncio.run(window.records())}
    assert gone.peer_id.to_base58() in seen and len(seen) == 6  # one miss may be a replica's
    for _ in range(RECORD_SHARDS // SHARDS_PER_PERIOD):
        seen = {r.peer_id for r in asyncio.run(window.records())}
    assert gone.peer_id.to_base58() not in seen and len(seen) == 5


def test_a_record_one_read_missed_stays_in_view():
    swarm = Swarm(6)
    window = RecordWindow(MODEL, swarm.read)
    asyncio.run(window.records())
    hidden = swarm.peers.pop()
    for _ in range(RECORD_SHARDS // SHARDS_PER_PERIOD):
        asyncio.run(window.records())
    swarm.peers.append(hidden)  # found again on the next read of its shard
    for _ in range(2 * RECORD_SHARDS // SHARDS_PER_PERIOD):
        assert len(asyncio.run(window.records())) == 6


def test_a_peer_that_says_it_left_leaves_the_view_at_once():
    swarm = Swarm(6)
    swarm.gone = swarm.peers[0].peer_id.to_base58()
    window = RecordWindow(MODEL, swarm.read)
    asyncio.run(window.records())
    swarm.states[swarm.gone] = PeerState.GONE
    for _ in range(RECORD_SHARDS // SHARDS_PER_PERIOD):
        seen = {r.peer_id for r in asyncio.run(window.records())}
    assert swarm.gone not in seen and len(seen) == 5


def test_a_failed_read_keeps_what_was_held_until_it_is_too_old():
    swarm = Swarm(6)
    window = RecordWindow(MODEL, swarm.read)
    asyncio.run(window.records())
    swarm.down = True
    assert len(asyncio.run(window.records())) == 6  # the DHT did not answer: nothing dropped
    for _ in range(window.max_age_reads - 2):
        assert len(asyncio.run(window.records())) == 6
    assert asyncio.run(window.records()) == []  # not read in two turns of reads: too old to trust
    swarm.down = False
    for _ in range(RECORD_SHARDS // SHARDS_PER_PERIOD):  # back in windows, never whole again
        seen = asyncio.run(window.records())
        assert len(swarm.asked[-1]) == SHARDS_PER_PERIOD
    assert len(seen) == 6


def test_a_peers_window_reads_about_its_bound_of_records_a_period_and_still_sees_every_shard():
    swarm = Swarm(48)  # 1.5 records a shard: a bound of 1 record a read lets it read a shard or so
    window = RecordWindow(MODEL, swarm.read, records_per_read=1)
    asyncio.run(window.records())
    per_shard = {s: sum(record_shard(p.peer_id.to_base58()) == s for p in swarm.peers) for s in range(32)}
    reads = 3 * RECORD_SHARDS
    for _ in range(reads):
        assert len(asyncio.run(window.records())) == 48  # what is not read this period is held
    read = [s for shards in swarm.asked[1:] for s in shards]
    assert sum(max(1, per_shard[s]) for s in read) <= reads + max(per_shard.values())
    assert set(read) == set(range(RECORD_SHARDS))  # every shard, in turn
    assert window.max_age_reads >= 2 * sum(max(1, n) for n in per_shard.values())


def test_the_coordinators_window_has_no_bound_in_records():
    swarm = Swarm(48)
    window = RecordWindow(MODEL, swarm.read, per_period=4, records_per_read=None)
    for _ in range(3):
        asyncio.run(window.records())
    assert [len(shards) for shards in swarm.asked[1:]] == [4, 4]
