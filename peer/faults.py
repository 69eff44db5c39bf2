"""Fault injection for failover tests: a peer that answers some steps wrongly on purpose.

Hidden `run-peer` flags (not in --help, defined in peer/flags.py; for tests, the chaos suite and
benchmarks only):

  --debug-fail-after N     every session's steps after its first N are faulty
  --debug-error-rate P     each step is faulty with probability P ...
  --debug-seed S           ... drawn from a generator seeded with S
  --debug-fault-on-signal  SIGUSR1: every later step is faulty; SIGUSR2: healthy again
  --debug-fault KIND       what a faulty step answers: "error" (a typed INTERNAL error frame,
                           the session is left as it was) or "nan" (the step runs, and its
                           output is replaced by NaN: garbage the client must catch)
  --debug-record F=JSON    announce JSON as field F of its record (repeatable): values no
                           honest peer would announce, for tests of the record's readers
  --debug-push MODE        steps pushed by another peer (peer/push.py) are "refuse"d (a
                           PUSH_ACK with an error) or "drop"ped (no answer at all), so the
                           pushing peer reports a failed push and the client relays instead;
                           "refuse" refuses a prefill peer's keys and values (KV_PUSH) too;
                           "equivocate" takes pushes, but pushes the next peer an output other
                           than the one it returns to the client (client/remote.py catches it);
                           "poison-kv" pushes a decode peer its prompt's keys and values one
                           token short (the decode peer's checks refuse them)

The server asks it about each validated step (`PeerServer._step`, before the step is queued
for the compute thread, batched or not); nothing else of the peer knows about it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import signal
from dataclasses import dataclass

import torch

from hexswarm.peer.core import PeerCore, Session
from hexswarm.swarm.wire.protocol import ErrorCode, ProtocolError, StepResult

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FaultPlan:
    fail_after: int | None = None
    error_rate: float = 0.0
    seed: int = 0
    on_signal: bool = False
    kind: str = "error"  # "error" or "nan"
    push: str = ""  # "refuse" or "drop" pushed steps, or "equivocate" on its own; "" is honest

    @property
    def active(self) -> bool:
        return self.fail_after is not None or self.error_rate > 0 or self.on_signal or bool(self.push)


def plan_from_args(args: argparse.Namespace) -> FaultPlan | None:
    plan = FaultPlan(
        fail_after=args.debug_fail_after,
        error_rate=args.debug_error_rate,
        seed=args.debug_seed,
        on_signal=args.debug_fault_on_signal,
        kind=args.debug_fault,
        push=args.debug_push,
    )
    return plan if plan.active else None


class FaultInjector:
    """Decides which steps are faulty and makes them so."""

    def __init__(self, core: PeerCore, plan: FaultPlan):
        self.core, self.plan = core, plan
        self.rng = random.Random(plan.seed)
        self.armed = False  # set by SIGUSR1, cleared by SIGUSR2
        self.steps: dict[str, int] = {}  # session id -> steps seen

    def install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.plan.on_signal:
            loop.add_signal_handler(signal.SIGUSR1, self._arm, True)
            loop.add_signal_handler(signal.SIGUSR2, self._arm, False)

    def _arm(self, on: bool) -> None:
        self.armed = on
        logger.warning("debug: steps are now %s", "faulty" if on else "healthy")

    def faulty(self, session: Session) -> bool:
        if len(self.steps) > 4 * max(1, self.core.limits.max_sessions):  # forget closed sessions
            self.steps = {key: n for key, n in self.steps.items() if key in self.core.sessions}
        n = self.steps[session.key] = self.steps.get(session.key, 0) + 1
        after = self.plan.fail_after
        return self.armed or (after is not None and n > after) or self.rng.random() < self.plan.error_rate

    def before_step(self, session: Session) -> bool:
        """Called for each validated step: raises the typed error of a faulty "error" step
        (the session is left as it was), or says whether to poison this step's output."""
        if not self.faulty(session):
            return False
        if self.plan.kind == "nan":
            return True
        self.core.end_step(session)  # the step never runs: release the session as a step's end does
        raise ProtocolError(ErrorCode.INTERNAL, "debug fault injection: this step fails on purpose")

    @property
    def drops_pushes(self) -> bool:
        return self.plan.push == "drop"

    @property
    def poisons_kv(self) -> bool:
        return self.plan.push == "poison-kv"

    @staticmethod
    def poisoned_kv(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What a poisoning prefill peer pushes: the prompt's last token left out."""
        return keys[..., :-1, :].contiguous(), values[..., :-1, :].contiguous()

    @property
    def equivocates(self) -> bool:
        return self.plan.push == "equivocate"

    @staticmethod
    def other_output(hidden: torch.Tensor) -> torch.Tensor:
        """What an equivocating peer pushes instead of `hidden`: close to it, but not it."""
        return hidden + 0.01 * hidden.std() * torch.randn_like(hidden)

    def check_push(self) -> None:
        """Called first on each pushed step: refuses it (or marks it for dropping) on purpose."""
        if self.plan.push in ("refuse", "drop"):
            raise ProtocolError(ErrorCode.BUSY, f"debug: this peer {self.plan.push}s pushed steps")

    @staticmethod
    def poison(result: StepResult) -> StepResult:
        """The step ran (its KV cache is real); its answer is garbage the client must catch."""
        return StepResult(result.session_id, torch.full_like(result.hidden, float("nan")))
