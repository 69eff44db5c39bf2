"""Spare memory serves blocks twice (swarm/coordinator/redundancy.py)."""

from __future__ import annotations

from hexswarm.swarm.coordinator.redundancy import served_counts, widen


def test_one_pipeline_widens_into_two_copies_of_every_block():
    # HexGen's search made one pipeline of four stages; each peer holds 15 of the 30 blocks.
    ranges = {"a": (0, 8), "b": (8, 15), "c": (15, 23), "d": (23, 30)}
    widened = widen(ranges, {p: 15 for p in ranges}, [], 30)
    assert min(served_counts(list(widened.values()), 30)) == 2, widened
    for peer, (start, end) in ranges.items():  # each still serves its stage, within its memory
        assert widened[peer][0] <= start and end <= widened[peer][1]
        assert widened[peer][1] - widened[peer][0] <= 15


def test_three_peers_of_two_thirds_cannot_hold_every_block_twice_but_widen_as_far_as_they_can():
    # Contiguous ranges: two copies of block 0 and of block 29 would take four ranges.
    ranges = {"a": (0, 10), "b": (10, 20), "c": (20, 30)}
    widened = widen(ranges, {p: 20 for p in ranges}, [], 30)
    assert sum(n >= 2 for n in served_counts(list(widened.values()), 30)) >= 20, widened


def test_widening_stops_at_two_copies_and_adds_the_fewest_blocks():
    ranges = {"a": (0, 8), "b": (0, 8), "c": (0, 4)}
    widened = widen(ranges, {"a": 8, "b": 8, "c": 8}, [], 8)
    assert widened["c"] == (0, 4)  # every block already has two copies: nothing to load


def test_blocks_nobody_serves_come_before_blocks_served_once():
    ranges = {"a": (0, 4), "b": (4, 6)}  # block 6:8 served by nobody
    widened = widen(ranges, {"a": 4, "b": 4}, [], 8)
    assert widened["b"] == (4, 8)


def test_fixed_peers_count_and_are_not_moved():
    widened = widen({"a": (2, 4)}, {"a": 4}, [(0, 2)], 4)
    assert widened["a"] == (0, 4)  # the fixed peer's blocks get their second copy from it
    assert widen({"a": (2, 4)}, {"a": 4}, [(0, 2), (0, 4)], 4)["a"] == (2, 4)  # two copies already


def test_without_spare_memory_nothing_changes_and_the_result_is_order_free():
    ranges = {"a": (0, 15), "b": (15, 30), "c": (5, 20)}
    assert widen(ranges, {p: 15 for p in ranges}, [], 30) == ranges
    ranges = {"x": (0, 10), "y": (10, 20), "z": (20, 30)}
    reversed_order = dict(reversed(list(ranges.items())))
    assert widen(ranges, {p: 15 for p in ranges}, [], 30) == widen(
        reversed_order, {p: 15 for p in ranges}, [], 30
    )
