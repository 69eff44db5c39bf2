"""Petals' block-selection rule: each server greedily takes the blocks with the least throughput.

This is the policy hexswarm falls back to when no coordinator is live (an `--layers auto` peer
picks its own range), and the core of the baseline the churn benchmark compares the coordinator
with (`routing/baselines/petals_policy.py`; how many blocks a Petals server takes and what it
announces are `routing/baselines/petals_server.py`). It is a port of Petals 2.2.0 (Borzunov et
al., "Distributed Inference and Fine-tuning of Large Language Models Over The Internet", §3.2),
written from its source, function by function:

- `block_throughputs` is `compute_spans` (petals/server/block_selection.py): every server that
  is not OFFLINE (JOINING ones included) adds its announced throughput to each of its blocks.
- `best_start` is `_choose_best_start`: the window whose per-block throughputs, sorted
  ascending, are lexicographically smallest (the weakest block first, then the second weakest...).
- `choose_start` is `choose_best_blocks`: where a joining server starts.
- `should_move` is `should_choose_other_blocks`: the server takes itself out (x (1 + eps), so
  that staying wins near-ties), refuses if that would leave some block unserved *while every
  block is served now* (with a gap, min = 0, the check goes on and a sole server may move),
  re-places itself, lets every server re-place itself in random order until nobody moves,
  and moves only if the weakest block gains: initial / new < balance_quality (0.75, i.e. the
  new minimum must be more than 1 / 0.75 = 1.33 x the current one; a gap, initial = 0, always
  passes when the settled layout has none). `balance_quality > 1` forces a move.
- `check_delay` is the wait in `Server.run`: uniform in [0, 2 x mean_balance_check_period]
  (120 s by default), drawn afresh after each check; a server checks only once its blocks are
  loaded, and a server that moves shuts down its blocks and loads all of its new ones.

Pure code: spans in, starts out. `random.Random` is injected so simulations are reproducible.
Not ported: quantisation (Petals loads NF4 on GPUs by default; the benchmark keeps every policy
at the model's dtype), and the 0-10 s random delay before a joiner reads the DHT.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# Petals' defaults (Server.__init__): move only if the weakest block would gain > 1/0.75 - 1 = 33 %.
DEFAULT_BALANCE_QUALITY = 0.75
MEAN_BALANCE_CHECK_PERIOD_S = 120.0
_MAX_SETTLE_ROUNDS = 100  # Petals loops until stable; bound it so ties can never spin forever
_EPS = 1e-3  # Petals' eps: a server takes itself out x (1 + eps), and a minimum below eps is a gap


@dataclass(frozen=True)
class Span:
    """One server's place: blocks [start, start + length) served at `throughput` (tokens/s)."""

    start: int
    length: int
    throughput: float

    @property
    def end(self) -> int:
        return self.start + self.length


def block_throughputs(num_blocks: int, spans: Sequence[Span]) -> list[float]:
    """The total throughput serving each block."""
    totals = [0.0] * num_blocks
    for span in spans:
        for block in range(max(0, span.start), min(num_blocks, span.end)):
            totals[block] += span.throughput
    return totals


def best_start(throughputs: Sequence[float], length: int) -> int:
    """The start of the window of `length` blocks whose sorted throughputs are smallest.

    Petals compares every window (min over (sorted window, start)); the best window's smallest
    block is the weakest block of all, so only windows holding a weakest block are compared."""
    count = len(throughputs)
    if not 1 <= length <= count:
        raise ValueError(f"a span of {length} blocks does not fit a model of {count} blocks")
    weakest = min(throughputs)
    starts: set[int] = set()
    for block, throughput in enumerate(throughputs):
        if throughput == weakest:
            starts.update(range(max(0, block - length + 1), min(block, count - length) + 1))
    return min((sorted(throughputs[start : start + length]), start) for start in starts)[1]


def choose_start(num_blocks: int, spans: Sequence[Span], length: int) -> int:
    """Where a joining server that holds `length` blocks should start, given the others' spans."""
    return best_start(block_throughputs(num_blocks, spans), min(length, num_blocks))


def should_move(
    num_blocks: int,
    spans: Sequence[Span],
    index: int,
    balance_quality: float = DEFAULT_BALANCE_QUALITY,
    rng: random.Random | None = None,
) -> int | None:
    """Petals' periodic check for server `index`: the start it should move to, or None to stay.

    It simulates the move and then lets every server re-place itself until the layout settles
    (only to judge the move: the other servers run the same check on their own schedule).
    """
    rng = rng or random.Random(0)
    placed = list(spans)
    totals = block_throughputs(num_blocks, placed)
    me = placed[index]
    if balance_quality > 1.0:  # Petals' debugging switch: rebalance on every check
        _add(totals, me, -1.0)
        return best_start(totals, me.length)
    initial_min = min(totals)
    _add(totals, me, -(1 + _EPS))
    if initial_min > _EPS and min(totals) <= 0:
        return None  # we are the only server of some block: moving would cut the swarm
    new_start = best_start(totals, me.length)
    if new_start == me.start:
        return None  # already at the best place
    _add(totals, me, _EPS)
    placed[index] = Span(new_start, me.length, me.throughput)
    _add(totals, placed[index], 1.0)
    _settle(totals, placed, rng)
    new_min = min(totals)
    if new_min < initial_min or new_min < _EPS:
        return None
    return new_start if initial_min / new_min < balance_quality - _EPS else None


def _settle(totals: list[float], placed: list[Span], rng: random.Random) -> None:
    """Lets each server re-place itself in random order until none moves (Petals' inner loop)."""
    moved, rounds = True, 0
    while moved and rounds < _MAX_SETTLE_ROUNDS:
        moved, rounds = False, rounds + 1
        order = list(range(len(placed)))
        rng.shuffle(order)
        for i in order:
            span = placed[i]
            _add(totals, span, -(1 + _EPS))
            start = best_start(totals, span.length)
            _add(totals, span, _EPS)
            if start != span.start:
                placed[i] = span = Span(start, span.length, span.throughput)
                moved = True
            _add(totals, span, 1.0)


def _add(totals: list[float], span: Span, factor: float) -> None:
    delta = factor * span.throughput
    totals[span.start : span.end] = [total + delta for total in totals[span.start : span.end]]


def check_delay(rng: random.Random, mean_period_s: float = MEAN_BALANCE_CHECK_PERIOD_S) -> float:
    """Seconds until a server's next balance check: uniform in [0, 2 x the mean period]."""
    return rng.random() * 2 * mean_period_s
