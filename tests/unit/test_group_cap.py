"""Records per IP group per block in front of a router (client/group_cap.py): plain records."""

from collections import Counter

from hexswarm.client.group_cap import cap_per_group
from tests.unit.record_cases import make_record

SEED = b"client-seed"


def _home(i: int, ip: str, start: int = 0, end: int = 4):
    return make_record(peer_id=f"peer-{ip}-{i}", start=start, end=end, addrs=(f"/ip4/{ip}/tcp/{4000 + i}",))


def test_twenty_identities_of_one_home_are_seen_as_four():
    sybils = [_home(i, "10.77.11.2") for i in range(20)]
    honest = [_home(0, "10.77.12.2"), _home(1, "10.77.13.2")]
    kept = cap_per_group(sybils + honest, limit=4, seed=SEED)
    assert len([r for r in kept if r in sybils]) == 4
    assert all(r in kept for r in honest)


def test_the_cap_counts_per_block_not_per_record():
    halves = [_home(i, "10.77.11.2", 0, 2) for i in range(6)] + [
        _home(i + 6, "10.77.11.2", 2, 4) for i in range(6)
    ]
    kept = cap_per_group(halves, limit=4, seed=SEED)
    per_block = Counter(b for r in kept for b in range(r.start, r.end))
    assert per_block == {0: 4, 1: 4, 2: 4, 3: 4}


def test_different_clients_see_different_members_of_a_crowded_group():
    sybils = [_home(i, "10.77.11.2") for i in range(20)]
    seen = {frozenset(r.peer_id for r in cap_per_group(sybils, 4, seed=bytes([s]) * 8)) for s in range(6)}
    assert len(seen) > 1


def test_a_block_only_a_capped_record_serves_stays_served():
    crowd = [_home(i, "10.77.11.2", 0, 2) for i in range(4)]
    tail = _home(9, "10.77.11.2", 0, 4)  # the only one serving blocks 2 and 3
    kept = cap_per_group([*crowd, tail], limit=4, seed=SEED)
    assert tail in kept


def test_loopback_has_no_group_and_zero_turns_the_cap_off():
    local = [_home(i, "127.0.0.1") for i in range(10)]
    assert cap_per_group(local, 4, SEED) == local
    lan = [_home(i, "192.168.1.2") for i in range(10)]
    assert cap_per_group(lan, 0, SEED) == lan


def test_relayed_peers_count_under_the_group_their_helpers_saw_not_their_relays():
    """20 homes behind NAT, all relayed by two bootstraps: seen as 20 groups, not 2 (issue 49)."""
    relays = ("/ip4/203.0.113.5/tcp/40001/p2p/QmA", "/ip4/203.0.113.6/tcp/40002/p2p/QmA")
    homes = [
        make_record(
            peer_id=f"home-{i}", addrs=relays, reachability="relayed", observed_group=f"198.51.{i}.0/24"
        )
        for i in range(20)
    ]
    assert len(cap_per_group(homes, limit=4, seed=SEED)) == 20
    unknown = [make_record(peer_id=f"old-{i}", addrs=relays, reachability="relayed") for i in range(8)]
    assert len(cap_per_group(unknown, limit=4, seed=SEED)) == 4  # no group said: the relays' counts


def test_a_record_names_an_ip_network_as_its_observed_group_or_nothing():
    import pytest

    from hexswarm.swarm.trust.records import PeerRecord

    record = make_record(reachability="relayed", observed_group="198.51.100.0/24")
    assert PeerRecord.from_bytes(record.to_bytes()).observed_group == "198.51.100.0/24"
    with pytest.raises(ValueError, match="observed_group"):
        PeerRecord.from_bytes(make_record(reachability="relayed", observed_group="x" * 80).to_bytes())
