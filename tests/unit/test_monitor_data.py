"""The monitor's JSON: coverage, missing blocks, the tokens/s estimate, defaults for TP and devices."""

from __future__ import annotations

import dataclasses
import json

from hexswarm.client.monitor_data import estimated_decode_tokens_per_s, model_entry, peer_entry
from hexswarm.swarm.trust.records import DeviceInfo, PeerState
from tests.unit.record_cases import make_record


def test_model_entry_maps_coverage_and_missing_blocks():
    records = [
        make_record(peer_id="A", name="a", start=0, end=2, decode_ms_per_block=1.0),
        make_record(peer_id="B", name="b", start=1, end=4, decode_ms_per_block=2.0, open_sessions=3),
        make_record(peer_id="C", name="c", start=4, end=6, state=PeerState.LEAVING, open_sessions=5),
    ]
    entry = model_entry("m-1", 6, records, rtts={"A": 1.5})
    assert entry["coverage"] == [1, 2, 1, 1, 0, 0]
    assert entry["missing"] == [4, 5]
    assert entry["open_sessions"] == 8  # a leaving peer still finishes its open sessions
    assert [p["name"] for p in entry["peers"]] == ["a", "b", "c"]
    assert entry["peers"][0]["rtt_ms"] == 1.5 and entry["peers"][1]["rtt_ms"] is None
    assert entry["estimated_tokens_per_s"] is None  # blocks 4:6 have no online peer
    json.dumps(entry)  # all plain JSON


def test_a_peer_that_did_not_answer_is_shown_with_why_and_covers_nothing():
    records = [
        make_record(peer_id="A", name="a", start=0, end=4),
        make_record(peer_id="B", name="b", start=2, end=4),
    ]
    entry = model_entry("m-1", 4, records, rtts={"A": 1.5}, silent={"B": "all dials failed"})
    assert entry["coverage"] == [1, 1, 1, 1] and entry["single_peer"] == [0, 1, 2, 3]
    b = next(p for p in entry["peers"] if p["name"] == "b")
    assert b["state"] == "online" and b["rtt_ms"] is None and b["ping_error"] == "all dials failed"
    entry = model_entry("m-1", 4, records, rtts={"B": 1.0}, silent={"A": "timeout"})
    assert entry["missing"] == [0, 1]


def test_estimate_takes_the_fastest_online_peer_per_block():
    records = [
        make_record(peer_id="A", start=0, end=4, decode_ms_per_block=2.0),
        make_record(peer_id="B", start=2, end=4, decode_ms_per_block=0.5),
        make_record(peer_id="C", start=0, end=4, decode_ms_per_block=0.1, state=PeerState.JOINING),
    ]
    assert estimated_decode_tokens_per_s(records, 4) == 1000 / (2.0 + 2.0 + 0.5 + 0.5)


def test_peer_entry_shows_tp_and_one_label_per_rank():
    plain = peer_entry(make_record(device="cuda:0"), rtt_ms=None)
    assert plain["tp"] == 1 and plain["devices"] == ["cuda:0"] and plain["layers"] == "0:4"

    gpu = DeviceInfo(type="cuda", name="NVIDIA H100", memory_bytes=80 * 2**30, cores=132)
    entry = peer_entry(dataclasses.replace(make_record(), tp=2, devices=(gpu, gpu)), rtt_ms=3.0)
    assert entry["tp"] == 2 and entry["devices"] == ["cuda, NVIDIA H100, 80 GiB"] * 2
    assert entry["device_info"][0]["cores"] == 132 and entry["rtt_ms"] == 3.0


def test_model_entry_shows_the_coordinator_and_its_plan():
    from hexswarm.swarm.coordinator.records import Assignment, Coordination, Lease, PlanRecord

    records = [make_record(peer_id="A", name="a", start=0, end=6, auto=True, plan_version=3)]
    assert model_entry("m-1", 6, records, rtts={})["plan"] is None
    plan = PlanRecord("m-1", 3, "K", "abc", 0.9, 120.0, (Assignment("A", 0, 6, 1),))
    entry = model_entry("m-1", 6, records, {}, Coordination(Lease("m-1", "K", 1.0), plan, 3))
    assert entry["coordinator"] == "K"
    assert entry["plan"]["version"] == 3 and entry["plan"]["followers"] == ["A"]
    json.dumps(entry)


def test_collect_shows_the_lease_only_of_trusted_coordinator_keys():
    """The monitor of a public swarm (no key trusted) must not show a stranger's claim with
    since = 0 as the coordinator, as the swarm's peers do not follow it."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from hexswarm.client.monitor_data import collect
    from hexswarm.swarm.coordinator.records import Lease, lease_key
    from hexswarm.swarm.net.identity import load_or_create_identity

    stranger = load_or_create_identity(None)
    claim = Lease("m-1", stranger.peer_id.to_base58(), 0.0)
    values = {lease_key("m-1"): {stranger.owner_marker: SimpleNamespace(value=claim.to_bytes())}}

    class Dht:
        def get(self, key, return_future, **search):
            future = Future()
            entries = values.get(key)
            future.set_result(None if entries is None else SimpleNamespace(value=entries))
            return future

        def run_coroutine(self, search, return_future):  # a read of many keys (the records' shards)
            future = Future()
            future.set_result({key: self.get(key, True).result() for key in search.args[0]})
            return future

    swarm = SimpleNamespace(dht=Dht(), round_trips=lambda records: {})
    shown = collect(swarm, {"m-1": 4}, trust=None)["models"][0]["coordinator"]
    assert shown == stranger.peer_id.to_base58()  # a private swarm trusts any member
    assert collect(swarm, {"m-1": 4}, trust=frozenset())["models"][0]["coordinator"] is None
