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
    observed = {"QmA": sr.Observed(1.0, 3), "QmB": sr.Observed(3.5, 4), "QmC": sr.Observed(1.0, 5)}
    slowed, kept, unchanged = sr.as_observed([boaster, honest, modest], observed)
    assert slowed.decode_ms_per_block == 1.0 and slowed.throughput == pytest.approx(100.0)
    assert kept == honest  # within 2x: its own figures stand
    assert unchanged == modest  # observed faster than it says: never sped up
    assert sr.over_announced(boaster, observed) == observed["QmA"]
    assert sr.over_announced(honest, observed) is None
