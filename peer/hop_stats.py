"""Where a step's time goes on a peer outside the forward pass (the per-hop cost).

Per step: `in` = frame fully read -> job queued (msgpack decode, tensor copy, checks),
`queue` = queued -> forward start (compute-thread hand-off and waiting for the thread,
less the batch window), `window` = waiting for a decode batch to fill (on purpose),
`compute` = the forward, `out` = forward end -> frame written (result hand-off back to
the event loop, encoding, write). A summary is logged every announce period.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PARTS = ("in", "queue", "window", "compute", "out")


@dataclass
class HopStats:
    steps: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))

    def add(self, **parts: float) -> None:
        self.steps += 1
        for name, value in parts.items():
            self.seconds[name] += max(0.0, value)

    def summary(self) -> str:
        """e.g. 'hop cost over 120 steps (ms/step): in 0.08 queue 0.05 window 0.4 compute 2.1 out 0.09'"""
        per_step = {name: 1000 * s / max(1, self.steps) for name, s in self.seconds.items()}
        overhead = per_step["in"] + per_step["queue"] + per_step["out"]
        figures = " ".join(f"{name} {per_step[name]:.3f}" for name in PARTS)
        return f"hop cost over {self.steps} steps (ms/step): {figures}; overhead {overhead:.3f}"

    def take(self) -> HopStats:
        """These figures, and a fresh start for the next period."""
        taken = HopStats(self.steps, dict(self.seconds))
        self.steps, self.seconds = 0, dict.fromkeys(PARTS, 0.0)
        return taken
