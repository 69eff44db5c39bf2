"""The monitor's JSON: coverage, missing blocks, the tokens/s estimate, defaults for TP and devices."""

from __future__ import annotations

import dataclasses
import json

from swarm.monitor_data import estimated_decode_tokens_per_s, model_entry, peer_entry
from swarm.records import PeerRecord, PeerState
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


def test_estimate_takes_the_fastest_online_peer_per_block():
    records = [
        make_record(peer_id="A", start=0, end=4, decode_ms_per_block=2.0),
        make_record(peer_id="B", start=2, end=4, decode_ms_per_block=0.5),
        make_record(peer_id="C", start=0, end=4, decode_ms_per_block=0.1, state=PeerState.JOINING),
    ]
    assert estimated_decode_tokens_per_s(records, 4) == 1000 / (2.0 + 2.0 + 0.5 + 0.5)


def test_peer_entry_defaults_tp_and_devices_and_reads_them_when_present():
    plain = peer_entry(make_record(device="cuda:0"), rtt_ms=None)
    assert plain["tp"] == 1 and plain["devices"] == ["cuda:0"] and plain["layers"] == "0:4"

    @dataclasses.dataclass(frozen=True)
    class NewerRecord(PeerRecord):  # with the TP fields another change adds to PeerRecord
        tp: int = 1
        devices: tuple = ()

    base = make_record()
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    entry = peer_entry(NewerRecord(**fields, tp=2, devices=("cuda:0", "cuda:1")), rtt_ms=3.0)
    assert entry["tp"] == 2 and entry["devices"] == ["cuda:0", "cuda:1"]
