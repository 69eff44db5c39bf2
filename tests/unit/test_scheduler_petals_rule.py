"""Petals' block-selection rule (routing/scheduler/petals_rule.py)."""

import random

import pytest

from hexswarm.routing.baselines.petals_server import announced_throughput, network_rps, server_num_blocks
from hexswarm.routing.scheduler.petals_rule import (
    Span,
    best_start,
    block_throughputs,
    check_delay,
    choose_start,
    should_move,
)


def test_block_throughputs_add_up_per_block():
    assert block_throughputs(4, [Span(0, 2, 1.0), Span(1, 3, 2.0)]) == [1.0, 3.0, 2.0, 2.0]


def test_joining_server_covers_the_empty_blocks_first():
    assert choose_start(8, [Span(0, 4, 10.0)], 4) == 4
    assert choose_start(8, [Span(0, 3, 10.0), Span(5, 3, 10.0)], 2) == 3


def test_ties_go_to_the_weaker_second_block():
    # Windows [0,2) and [2,4) both hold a block at 1.0; the second block decides.
    assert best_start([1.0, 5.0, 1.0, 2.0], 2) == 2


def test_best_start_is_petals_lexicographic_min_over_sorted_windows():
    # Petals' own form: min over (sorted window, start), ties to the first start.
    def reference(throughputs, length):
        windows = ((sorted(throughputs[s : s + length]), s) for s in range(len(throughputs) - length + 1))
        return min(windows)[1]

    rng = random.Random(0)
    for _ in range(2000):
        blocks = rng.randint(1, 30)
        length = rng.randint(1, blocks)
        levels = rng.choice([2, 4, 1000])  # few levels: many ties between windows
        throughputs = [float(rng.randrange(levels)) * 0.5 for _ in range(blocks)]
        assert best_start(throughputs, length) == reference(throughputs, length)


def test_a_span_longer_than_the_model_is_refused():
    with pytest.raises(ValueError):
        best_start([1.0, 1.0], 3)


def test_a_sole_server_of_some_block_stays_while_every_block_is_served():
    spans = [Span(0, 4, 1.0), Span(4, 4, 1.0)]
    assert should_move(8, spans, 0) is None
    # The second server is the only one on block 4: leaving would cut a served swarm.
    assert should_move(5, [Span(0, 3, 1.0), Span(1, 4, 1.0)], 1) is None


def test_a_gap_makes_a_server_move_even_a_sole_server():
    # Blocks 4-7 have no server (a leaver's gap): the current minimum is 0, any gap-free
    # settled layout has a quality of 0 < 0.75, so one of the two servers of 0-3 moves.
    assert should_move(8, [Span(0, 4, 1.0), Span(0, 4, 1.0)], 0) == 4
    # Block 5 is a gap; the second server is the only one on blocks 3-4 and still moves to 2,
    # as Petals skips its "would disconnect the swarm" test when some block is already unserved.
    assert should_move(6, [Span(0, 3, 1.0), Span(1, 4, 1.0)], 1) == 2


def test_a_gap_that_no_settled_layout_closes_makes_nobody_move():
    # One server of 3 blocks cannot cover a 4-block model wherever it goes.
    assert should_move(4, [Span(0, 3, 1.0)], 0) is None


@pytest.mark.parametrize("moving, expected", [(1.6, None), (1.8, 1)])
def test_a_move_must_raise_the_weakest_block_by_more_than_one_over_balance_quality(moving, expected):
    # Blocks [0, 1): 10 + x, block [1, 2): 5. Moving the x server gives min(10, 5 + x):
    # 5 / 6.6 = 0.76 stays above 0.75; 5 / 6.8 = 0.74 is below it.
    spans = [Span(0, 1, 10.0), Span(0, 1, moving), Span(1, 1, 5.0)]
    assert should_move(2, spans, 1) == expected


def test_a_balance_quality_above_one_forces_a_new_choice():
    spans = [Span(0, 1, 10.0), Span(0, 1, 1.0), Span(1, 1, 5.0)]
    assert should_move(2, spans, 1) is None
    assert should_move(2, spans, 1, balance_quality=1.5) == 1


def test_announced_throughput_divides_by_the_mean_blocks_used_and_caps_by_the_network():
    assert announced_throughput(100.0, 3, 1e9) == 50.0
    assert announced_throughput(100.0, 1, 40.0) == 40.0
    assert network_rps(16 * 1024 * 10, 1024) == 10.0


def test_a_server_fills_its_memory_with_blocks_and_their_attention_cache():
    gib = 1024**3
    # No grouped-query attention: 8192 tokens of K and V, 2 x 14336 x 8192 x 2 B = 0.4375 GiB a
    # block; autograd takes 2 GiB: (10 - 2) / 1.4375 = 5.6 blocks.
    assert server_num_blocks(10 * gib, 1, 1 * gib, 14336, 14336, 2) == 5
    # Grouped-query attention (kv 1792 of 14336): 32768 tokens, 0.21875 GiB a block.
    assert server_num_blocks(10 * gib, 1, 1 * gib, 14336, 1792, 2) == 6
    assert server_num_blocks(2 * gib, 1, 1 * gib, 14336, 14336, 2) == 0


def test_checks_wait_uniformly_up_to_twice_the_mean_period():
    rng = random.Random(0)
    delays = [check_delay(rng, 120.0) for _ in range(2000)]
    assert 0.0 <= min(delays) and max(delays) <= 240.0
    assert 110.0 < sum(delays) / len(delays) < 130.0


def test_a_redundant_server_moves_to_the_weak_half():
    # Three servers crowd the first half; the second half has one slow server.
    spans = [Span(0, 4, 10.0), Span(0, 4, 10.0), Span(0, 4, 10.0), Span(4, 4, 1.0)]
    assert should_move(8, spans, 1) == 4


def test_a_balanced_swarm_stays():
    spans = [Span(0, 4, 10.0), Span(4, 4, 10.0), Span(0, 4, 10.0), Span(4, 4, 10.0)]
    assert all(should_move(8, spans, i) is None for i in range(4))
