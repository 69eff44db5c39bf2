"""When to re-plan, and when a new plan may replace the current one. Pure: the clock is passed in.

A join, a leave or a drift in a peer's measured figures marks the view as changed; the re-plan
runs `debounce_s` after the last change (so a burst of joins makes one re-plan), but no later
than `max_delay_s` after the first (so a steady trickle of joins cannot postpone it forever).
A periodic re-plan runs every `period_s` as well. A new plan replaces a still-valid current one
only if it beats it by a margin (`beats`), which stops plans from flapping between near-equals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplanPolicy:
    debounce_s: float = 5.0  # quiet time after the last change before re-planning
    max_delay_s: float = 30.0  # longest a change waits for its re-plan
    period_s: float = 300.0  # periodic re-plan even without changes
    drift: float = 0.3  # relative change of a peer's measured throughput that counts as a change
    attainment_margin: float = 0.02  # absolute gain in SLO attainment that justifies a new plan
    throughput_margin: float = 0.05  # relative gain in tokens/s that justifies a new plan

    def __post_init__(self) -> None:
        if min(self.debounce_s, self.max_delay_s, self.period_s) <= 0 or self.max_delay_s < self.debounce_s:
            raise ValueError("debounce, max delay and period must be positive, max delay >= debounce")


# peer id -> (measured throughput, whether its range is fixed): what a re-plan depends on
View = Mapping[str, tuple[float, bool]]


def changed(old: View, new: View, drift: float) -> str | None:
    """Why `new` differs from `old` enough to re-plan (join, leave, drift), or None."""
    if joined := new.keys() - old.keys():
        return f"{len(joined)} peer(s) joined"
    if left := old.keys() - new.keys():
        return f"{len(left)} peer(s) left"
    for peer, (throughput, fixed) in new.items():
        before, was_fixed = old[peer]
        if fixed != was_fixed:
            return "a peer changed between fixed and auto"
        if abs(throughput - before) > drift * max(before, 1e-9):
            return f"throughput of {peer[-8:]} drifted {before:.0f} -> {throughput:.0f}"
    return None


class ReplanTrigger:
    """Debounced change detection plus a periodic timer."""

    def __init__(self, policy: ReplanPolicy, now: float):
        self.policy = policy
        self.view: View | None = None
        self.first_change: float | None = None
        self.last_change: float | None = None
        self.reason: str | None = None
        self.last_plan = now

    def observe(self, view: View, now: float) -> None:
        """Feeds the current view; a difference from the last one starts or extends the debounce."""
        reason = "first view" if self.view is None else changed(self.view, view, self.policy.drift)
        if reason is None:
            return
        self.view = dict(view)  # drift is measured from the last view that counted as a change
        self.reason = reason
        self.last_change = now
        if self.first_change is None:
            self.first_change = now

    def force(self, reason: str, now: float) -> None:
        """Makes a re-plan due at once (a new lease holder plans before anything else)."""
        self.reason = reason
        self.first_change = self.last_change = now - self.policy.max_delay_s

    def due(self, now: float) -> str | None:
        """The reason to re-plan now, or None."""
        p = self.policy
        if self.first_change is not None:
            if now - self.last_change >= p.debounce_s or now - self.first_change >= p.max_delay_s:
                return self.reason
            return None  # a change is pending: the periodic re-plan would only come early
        if now - self.last_plan >= p.period_s:
            return "periodic"
        return None

    def planned(self, now: float) -> None:
        """A re-plan ran (whether or not its plan was published)."""
        self.first_change = self.last_change = self.reason = None
        self.last_plan = now


def beats(new: tuple[float, float], current: tuple[float, float], policy: ReplanPolicy) -> bool:
    """Whether a plan estimated at (attainment, tokens/s) `new` should replace `current`.

    Better attainment by the margin wins; equal attainment (within the margin) and more tokens/s
    by the relative margin wins too; anything else keeps the current plan.
    """
    (att, tps), (cur_att, cur_tps) = new, current
    if att >= cur_att + policy.attainment_margin:
        return True
    return (
        att > cur_att - policy.attainment_margin
        and tps >= cur_tps * (1 + policy.throughput_margin)
        and tps > 0
    )
