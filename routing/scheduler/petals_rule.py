"""Petals' block-selection rule: each server greedily takes the blocks with the least throughput.

This is the policy hexswarm falls back to when no coordinator is live (an `--layers auto` peer
picks its own range), and the baseline the churn benchmark compares the coordinator with.
It follows the rule of Petals 2.x (Borzunov et al., "Distributed Inference and Fine-tuning of
Large Language Models Over The Internet", §3.2 and its `block_selection` module):

- On join, a server that can hold `length` blocks takes the window whose per-block total
  throughput, sorted ascending, is lexicographically smallest: it covers the weakest block
  first, and among windows with the same weakest block, the weaker second block, and so on.
- Periodically, a server asks whether it should move: it takes itself out, re-places itself,
  lets every other server re-place itself in turn until nobody moves, and moves only if the
  swarm's weakest block would gain by more than `balance_quality` (0.75 in Petals: move when
  the current minimum is below 75 % of the achievable one), and never when leaving would
  disconnect the swarm.

Pure code: spans in, starts out. `random.Random` is injected so simulations are reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# Petals' default: move only if the swarm's weakest block would gain more than 1/0.75 - 1 = 33 %.
DEFAULT_BALANCE_QUALITY = 0.75
_MAX_SETTLE_ROUNDS = 100  # Petals loops until stable; bound it so ties can never spin forever
_EPS = 1e-3  # relative slack so that taking a span out never leaves a tiny positive residue


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
    """The start of the window of `length` blocks whose sorted throughputs are smallest."""
    if not 1 <= length <= len(throughputs):
        raise ValueError(f"a span of {length} blocks does not fit a model of {len(throughputs)} blocks")
    windows = (
        (sorted(throughputs[start : start + length]), start) for start in range(len(throughputs) - length + 1)
    )
    return min(windows)[1]


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
    initial_min = min(totals)
    me = placed[index]
    _add(totals, me, -(1 + _EPS))
    if initial_min > _EPS and min(totals) <= 0:
        return None  # we are the only server of some block: moving would cut the swarm
    new_start = best_start(totals, me.length)
    if new_start == me.start:
        return None
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
    for block in range(span.start, span.end):
        totals[block] += factor * span.throughput
