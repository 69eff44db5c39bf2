"""Observed speeds shared between clients (swarm/trust/speed_reports.py): plain data."""

import pytest

from hexswarm.swarm.trust import speed_reports as sr
from tests.unit.record_cases import make_record


def test_an_entry_round_trips_and_bad_ones_are_refused():
    speeds = {"QmA": (2.5, 32), "QmB": (0.7, 8)}
    assert sr.decode(sr.encode(speeds)) == speeds
    for bad in ({"QmA": [-1.0, 8]}, {"QmA": [1.0, 0]}, {"QmA": [float("nan"), 8]}, {"QmA": "fast"}):
        import msgpack

        with pytest.raises(ValueError):
            sr.decode(msgpack.packb({"schema": 1, "peers": bad}))
    with pytest.raises(ValueError):
        sr.decode(b"\x00" * 10)


def test_a_figure_needs_three_reporters_and_is_their_median():
    entries = {"c1": {"QmA": (30.0, 32)}, "c2": {"QmA": (20.0, 32)}}
    assert sr.combine(entries) == {}
    entries["c3"] = {"QmA": (25.0, 16)}
    assert sr.combine(entries) == {"QmA": sr.Observed(25.0, 3)}
    entries["QmA"] = {"QmA": (0.01, 32)}  # a peer's report on itself is no observation
    assert sr.combine(entries)["QmA"].reporters == 3


def test_only_an_over_announcer_is_slowed_and_never_sped_up():
    boaster = make_record(peer_id="QmA", decode_ms_per_block=0.01, throughput=10000.0)
    honest = make_record(peer_id="QmB", decode_ms_per_block=2.0, throughput=100.0)
    modest = make_record(peer_id="QmC", decode_ms_per_block=9.0, throughput=10.0)
    groups = (1.0, 1.0, 1.0)  # three proven groups agree: the figure counts in full
    observed = {"QmA": sr.Observed(1.0, 3, groups), "QmB": sr.Observed(3.5, 4), "QmC": sr.Observed(1.0, 5)}
    slowed, kept, unchanged = sr.as_observed([boaster, honest, modest], observed)
    assert slowed.decode_ms_per_block == 1.0 and slowed.throughput == pytest.approx(100.0)
    assert kept == honest  # within 2x: its own figures stand
    assert unchanged == modest  # observed faster than it says: never sped up
    assert sr.over_announced(boaster, observed) == observed["QmA"]
    assert sr.over_announced(honest, observed) is None


# Issue 49, item 9: reports count per reporter IP group, with a bounded effect, and the entries
# read are bounded.


def test_three_free_keys_move_an_honest_peers_plan_by_at_most_half():
    honest = make_record(peer_id="QmH", decode_ms_per_block=2.0, throughput=100.0)
    sybils = {f"key{i}": {"QmH": (50.0, 32)} for i in range(3)}  # one machine, three keys, no group
    (planned,) = sr.as_observed([honest], sr.combine(sybils))
    assert planned.decode_ms_per_block <= 2.0 * 2.0 and planned.throughput >= 50.0
    assert sr.over_announced(honest, sr.combine(sybils)) is not None  # still shown as a flag


def test_identities_of_one_group_count_once_and_several_groups_agreeing_count_in_full():
    boaster = make_record(peer_id="QmB", decode_ms_per_block=0.05, throughput=10000.0)
    entries = {f"sybil{i}": {"QmB": (0.06, 32)} for i in range(5)}  # the boaster's own home
    entries |= {"c1": {"QmB": (30.0, 32)}, "c2": {"QmB": (31.0, 32)}, "c3": {"QmB": (29.0, 32)}}
    groups = {f"sybil{i}": "198.51.100.0/24" for i in range(5)}
    groups |= {"c1": "203.0.113.0/24", "c2": "192.0.2.0/24", "c3": "100.64.1.0/24"}
    figure = sr.combine(entries, groups)["QmB"]
    assert figure.ms_per_block == pytest.approx(29.5) and figure.groups == 4 and figure.reporters == 8
    (planned,) = sr.as_observed([boaster], {"QmB": figure})
    assert planned.decode_ms_per_block == pytest.approx(29.5)  # three groups agree: full effect
    two = sr.combine({k: v for k, v in entries.items() if k != "c3"}, groups)
    (bounded,) = sr.as_observed([boaster], two)
    assert bounded.decode_ms_per_block == pytest.approx(0.1)  # two groups: at most x0.5


class _Item:
    def __init__(self, value, expiration_time):
        self.value, self.expiration_time = value, expiration_time


class _Dict:
    def __init__(self, value):
        self.value = value


def test_the_entries_read_are_bounded_newest_first_per_group(monkeypatch):
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.utils.crypto import RSAPrivateKey

    from hexswarm.swarm.net.identity import peer_id_from_owner_marker

    markers = [RSASignatureValidator(RSAPrivateKey()).local_public_key for _ in range(12)]
    now = 1000.0
    value = {m: _Item(sr.encode({"QmX": (40.0, 8)}), now + 100.0 + i) for i, m in enumerate(markers)}
    far = RSASignatureValidator(RSAPrivateKey()).local_public_key  # claims to live for a year
    value[far] = _Item(sr.encode({"QmX": (40.0, 8)}), now + 365 * 86400.0)
    monkeypatch.setattr(sr, "get_latest", lambda dht, key, timeout: _Dict(value))
    monkeypatch.setattr(sr, "get_dht_time", lambda: now, raising=False)
    entries = sr.read(None, "m-1")  # 13 reporters, all unproven: one group, its 8 newest read
    newest = {peer_id_from_owner_marker(m).to_base58() for m in markers[-8:]}
    assert set(entries) == newest


def test_a_reporter_is_placed_by_the_connection_it_holds_with_its_own_key(monkeypatch):
    import asyncio
    from types import SimpleNamespace

    from hivemind.dht.crypto import RSASignatureValidator

    from hexswarm.client import swarm_client
    from hexswarm.swarm.net.identity import peer_id_from_owner_marker

    monkeypatch.setattr(swarm_client, "_signing_identity_taken", False)
    me = swarm_client.signing_identity().peer_id  # a client's libp2p id: the key it signs reports with
    assert me == peer_id_from_owner_marker(RSASignatureValidator().local_public_key)
    assert swarm_client.signing_identity() is None  # a second client of the process: a random id
    other = SimpleNamespace(to_base58=lambda: "QmLocal")

    class P2P:
        async def list_peers(self):
            return [
                SimpleNamespace(peer_id=me, addrs=["/ip4/203.0.113.9/tcp/4242"]),
                SimpleNamespace(peer_id=other, addrs=["/ip4/127.0.0.1/tcp/4242"]),  # places nobody
            ]

    assert asyncio.run(sr.connected_groups(P2P())) == {me.to_base58(): "203.0.113.0/24"}
