"""Petals' block-selection rule (routing/scheduler/petals_rule.py)."""

import pytest

from routing.scheduler.petals_rule import Span, best_start, block_throughputs, choose_start, should_move


def test_block_throughputs_add_up_per_block():
    assert block_throughputs(4, [Span(0, 2, 1.0), Span(1, 3, 2.0)]) == [1.0, 3.0, 2.0, 2.0]


def test_joining_server_covers_the_empty_blocks_first():
    assert choose_start(8, [Span(0, 4, 10.0)], 4) == 4
    assert choose_start(8, [Span(0, 3, 10.0), Span(5, 3, 10.0)], 2) == 3


def test_ties_go_to_the_weaker_second_block():
    # Windows [0,2) and [2,4) both hold a block at 1.0; the second block decides.
    assert best_start([1.0, 5.0, 1.0, 2.0], 2) == 2


def test_a_span_longer_than_the_model_is_refused():
    with pytest.raises(ValueError):
        best_start([1.0, 1.0], 3)


def test_a_sole_server_of_some_block_never_moves():
    spans = [Span(0, 4, 1.0), Span(4, 4, 1.0)]
    assert should_move(8, spans, 0) is None


def test_a_redundant_server_moves_to_the_weak_half():
    # Three servers crowd the first half; the second half has one slow server.
    spans = [Span(0, 4, 10.0), Span(0, 4, 10.0), Span(0, 4, 10.0), Span(4, 4, 1.0)]
    assert should_move(8, spans, 1) == 4


def test_a_balanced_swarm_stays():
    spans = [Span(0, 4, 10.0), Span(4, 4, 10.0), Span(0, 4, 10.0), Span(4, 4, 10.0)]
    assert all(should_move(8, spans, i) is None for i in range(4))
