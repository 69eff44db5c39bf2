"""Windows of each rank's compute per decode step: what a `--partition auto` group's drift check
reads (peer/tp/partition.py, run by peer/tp/rebalance.py).

A rank sums the compute of its decode steps (its waits in collectives excluded,
peer/tp/profile.py's `ComputeClock`) and reports the sums every REPORT_S (`DecodeTimes`); the
leader adds them up per rank and stack, with its own, until every rank has reported enough
steps for a fair mean (`DecodeWindows`). Only decode steps count: they are what the split is
sized for. A window belongs to one stack, so figures of an old split never mix with a new one's.
"""

from __future__ import annotations

import time

REPORT_S = 0.5  # how often a rank reports its decode compute to the leader


class DecodeTimes:
    """A rank's decode-step compute of its current stack; hands out a report every REPORT_S."""

    def __init__(self):
        self.stack_id, self.steps, self.compute_s = 0, 0, 0.0
        self.since = time.monotonic()

    def add(self, stack_id: int, compute_s: float) -> tuple[int, int, float] | None:
        """Counts one decode step; every REPORT_S, (stack id, steps, compute s) since the last."""
        if stack_id != self.stack_id:
            self.stack_id, self.steps, self.compute_s = stack_id, 0, 0.0
        self.steps, self.compute_s = self.steps + 1, self.compute_s + compute_s
        if time.monotonic() - self.since < REPORT_S:
            return None
        report = (self.stack_id, self.steps, self.compute_s)
        self.steps, self.compute_s, self.since = 0, 0.0, time.monotonic()
        return report


class DecodeWindows:
    """The leader's current window: each rank's decode steps and compute seconds, per stack."""

    def __init__(self):
        self._windows: dict[tuple[int, int], list] = {}  # (rank, stack id) -> [decode steps, compute s]

    def note(self, rank: int, stack_id: int, steps: int, compute_s: float) -> None:
        """Adds a rank's decode compute to the current window."""
        window = self._windows.setdefault((rank, stack_id), [0, 0.0])
        window[0] += steps
        window[1] += compute_s

    def take(self, stack_id: int, tp: int, min_steps: int) -> tuple[list[float], int]:
        """Each of ranks 0..tp-1's mean compute per decode step of stack `stack_id` over the
        current window, and the fewest steps any rank reported. A window ends (and the next
        starts) once every rank has reported `min_steps`; before that this returns ([], fewest)."""
        windows = [self._windows.get((rank, stack_id), [0, 0.0]) for rank in range(tp)]
        steps = min(w[0] for w in windows)
        if steps < min_steps:
            return [], steps
        for rank in range(tp):
            self._windows.pop((rank, stack_id), None)
        return [w[1] / w[0] for w in windows], steps

    def clear(self) -> None:
        """Forgets every window (their figures are of a split no longer served)."""
        self._windows.clear()
