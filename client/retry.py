"""How hard a client tries when peers fail: backoff, bans, a per-call budget (pure, no I/O).

- Between two attempts at the same repair the client waits an exponentially growing delay
  with jitter ("equal jitter": half fixed, half random), so many clients that lost the same
  peer do not all hit its replacements at once.
- A peer that failed is banned by this client for `ban_base_s`, and each new failure of the
  same peer multiplies that by `ban_factor` (up to `ban_max_s`): a flaky peer is tried
  again later, a broken one is soon left alone for minutes.
- A peer that answers RATE_LIMITED is not failing: it asks the session to slow down
  (peer/admission.py). The client waits what the peer named (clamped) and sends the same step
  again, up to `rate_limit_wait_s` per step; past that, the peer counts as failed.
- A peer that answers BUSY or REMOTE_LIMIT is full, for everyone or for this client: that is
  back-pressure, not a fault. The client routes around it for `busy_avoid_s` without counting
  a failure against it (its next real ban does not grow), and tries it again after.
- Each `generate()` call (one session) may spend at most `max_retries` failed attempts and
  `retry_budget_s` seconds on failovers; then it raises `FailoverError`, which lists every
  attempt (peer, blocks, error).
- When no peer serves a span any more (its peers failed and no other announces it), the call
  waits `replacement_wait_s` for one to appear and then raises `SpanUnservedError`, naming the
  blocks; a user who would rather wait for a peer to come back allows longer.
"""

from __future__ import annotations

import random
import re
import threading
import time
from dataclasses import dataclass, field

from hexswarm.client.remote import PeerError
from hexswarm.swarm.wire.protocol import ErrorCode


@dataclass(frozen=True)
class RetryPolicy:
    """Knobs of failover; `DistributedModelForCausalLM.from_pretrained(retry=RetryPolicy(...))`."""

    max_retries: int = 8  # failed attempts (steps, opens, replays) one generate() call may absorb
    retry_budget_s: float = 60.0  # seconds one generate() call may spend recovering, over all failures
    backoff_base_s: float = 0.05  # wait before the 2nd attempt of one repair; doubles per attempt
    backoff_max_s: float = 5.0
    ban_base_s: float = 10.0  # first ban of a failing peer; long enough to route around a stall
    ban_factor: float = 2.0
    ban_max_s: float = 600.0
    # Step deadlines (client.deadline): slack x the peer's announced compute time + RTT, at least the
    # floor. The floor is what a stalled peer costs; 1 s is many times a tiny model's step on 2 busy cores.
    deadline_slack: float = 8.0
    deadline_floor_s: float = 1.0
    max_history_bytes: int = 1 << 30  # bound on the kept hop inputs (client.history)
    # Push between peers (peer/push.py): how long a peer waits for the next peer to take a pushed
    # step before it reports the push failed (the client then relays that hop). Long enough for a
    # busy peer's event loop to read and check a frame; a stalled next peer costs this much more.
    push_ack_timeout_s: float = 1.0
    # A hop's first push waits this much longer: its peer may first read the next peer's record
    # and dial it (a new libp2p connection: seconds on a loaded machine or a slow link).
    push_first_extra_s: float = 2.0
    # Deadlines and push acks also allow for the bytes a step carries at this rate: a home
    # uplink's floor (8 Mbit/s). A 2,048-token prefill at hidden size 8,192 in fp16 is 32 MiB a
    # hop, 34 s at this rate; a decode step of SmolLM2 is 2.3 KB, 2 ms.
    min_link_bytes_per_s: float = 1e6
    # A peer's RATE_LIMITED asks for a wait, not a failover: this much waiting per step at most.
    rate_limit_wait_s: float = 5.0
    # A peer that is full (BUSY, REMOTE_LIMIT) is routed around this long, with no ban.
    busy_avoid_s: float = 5.0
    # No peer serves a span any more: how long a call waits for one to join before it says so.
    replacement_wait_s: float = 3.0

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.retry_budget_s <= 0:
            raise ValueError("max_retries must be >= 0 and retry_budget_s > 0")
        if self.backoff_base_s < 0 or self.ban_base_s < 0 or self.ban_factor < 1:
            raise ValueError("backoff and ban durations must be >= 0, ban_factor >= 1")
        if self.deadline_slack < 1 or self.deadline_floor_s <= 0:
            raise ValueError("deadline_slack must be >= 1 and deadline_floor_s > 0")
        if not 0.001 <= self.push_ack_timeout_s <= 60:
            raise ValueError("push_ack_timeout_s must be in [0.001, 60]")
        if not 0 <= self.push_first_extra_s <= 60:
            raise ValueError("push_first_extra_s must be in [0, 60]")
        if not self.min_link_bytes_per_s > 0:
            raise ValueError("min_link_bytes_per_s must be > 0")
        if self.rate_limit_wait_s < 0 or self.busy_avoid_s < 0 or self.replacement_wait_s < 0:
            raise ValueError("rate_limit_wait_s, busy_avoid_s and replacement_wait_s must be >= 0")


def backoff_delay(attempt: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Seconds to wait before attempt `attempt` (0 = the first: no wait) of one repair."""
    if attempt <= 0:
        return 0.0
    cap = min(policy.backoff_max_s, policy.backoff_base_s * 2 ** (attempt - 1))
    return cap / 2 + rng.uniform(0, cap / 2)


_RETRY_IN = re.compile(r"retry in (\d{1,7}(?:\.\d{1,3})?) ms")
RATE_LIMIT_DEFAULT_WAIT_S = 0.05  # when the peer's message names no wait
RATE_LIMIT_MAX_WAIT_S = 1.0  # one wait at most, whatever the peer names


BACK_PRESSURE = (ErrorCode.BUSY, ErrorCode.REMOTE_LIMIT)  # "full": route elsewhere, blame nobody


def rate_limit_wait(error: PeerError) -> float | None:
    """Seconds to wait before sending the refused step again, when `error` is a RATE_LIMITED
    refusal (the peer computed nothing); None for any other error. The wait is the one the
    peer's message names ("retry in 3 ms"), remote input, so clamped to (0, 1] s."""
    if error.code != ErrorCode.RATE_LIMITED:
        return None
    named = _RETRY_IN.search(error.message or "")
    wait = float(named.group(1)) / 1000 if named else RATE_LIMIT_DEFAULT_WAIT_S
    return min(max(wait, 0.001), RATE_LIMIT_MAX_WAIT_S)


class BanList:
    """Peers this client avoids for a while; shared by all sessions of one model (thread-safe)."""

    def __init__(self, policy: RetryPolicy, clock=time.monotonic):
        self.policy, self.clock = policy, clock
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}  # peer id -> end of its ban (clock time)
        self._failures: dict[str, int] = {}  # peer id -> failures seen, for the growing ban

    def ban(self, peer_id: str) -> float:
        """Bans `peer_id` after one more failure; returns the ban's length in seconds."""
        p = self.policy
        with self._lock:
            failures = self._failures.get(peer_id, 0) + 1
            self._failures[peer_id] = failures
            duration = min(p.ban_max_s, p.ban_base_s * p.ban_factor ** (failures - 1))
            self._until[peer_id] = max(self._until.get(peer_id, 0.0), self.clock() + duration)
            return duration

    def avoid(self, peer_id: str, seconds: float) -> None:
        """Routes around `peer_id` for `seconds` without counting a failure: it said it is full
        for this client (back-pressure), which is no fault, so the next real ban does not grow."""
        with self._lock:
            self._until[peer_id] = max(self._until.get(peer_id, 0.0), self.clock() + seconds)

    def lift(self, peer_id: str) -> None:
        """Ends `peer_id`'s ban now (it answers again); its failure count stays."""
        with self._lock:
            self._until.pop(peer_id, None)

    def banned(self) -> frozenset[str]:
        """Peers banned right now."""
        now = self.clock()
        with self._lock:
            for peer_id in [p for p, until in self._until.items() if until <= now]:
                del self._until[peer_id]  # expired; its failure count stays, so the next ban is longer
            return frozenset(self._until)


@dataclass(frozen=True)
class Attempt:
    """One failed attempt, for the final error message."""

    peer: str  # name (or id) of the peer that failed; "(none)" when no route was found
    start: int  # blocks [start, end) the attempt was for
    end: int
    error: str


class FailoverError(PeerError):
    """The retry budget of one generate() call ran out; `attempts` says what was tried."""

    def __init__(self, attempts: list[Attempt], reason: str):
        self.attempts = list(attempts)
        tried = "; ".join(f"{a.peer}[{a.start}:{a.end}): {a.error}" for a in attempts) or "nothing"
        last = attempts[-1] if attempts else None
        super().__init__(
            last.peer if last else "(none)",
            ErrorCode.PEER_FAILED,
            f"failover gave up ({reason}) after {len(attempts)} failed attempts: {tried}",
        )


class SpanUnservedError(FailoverError):
    """No peer serves blocks [start, end) any more, and none joined within the wait allowed."""

    def __init__(self, attempts: list[Attempt], model_id: str, start: int, end: int, waited_s: float):
        self.attempts, self.start, self.end = list(attempts), start, end
        failed = [a for a in attempts if a.peer != "(none)"]
        cause = (
            f" (the last peer that served them, {failed[-1].peer}, failed: {failed[-1].error})"
            if failed
            else ""
        )
        message = (
            f"no peer serves blocks {start}:{end} of {model_id} now{cause}; waited {waited_s:.1f} s "
            "for another to join (allow longer with RetryPolicy(replacement_wait_s=...) or "
            "--replacement-wait SECONDS)"
        )
        PeerError.__init__(self, failed[-1].peer if failed else "(none)", ErrorCode.PEER_FAILED, message)
        self.args = (message,)  # the message alone: no one peer "refused"


@dataclass
class RetryBudget:
    """What one generate() call has spent on failures so far."""

    policy: RetryPolicy
    clock: object = time.monotonic
    attempts: list[Attempt] = field(default_factory=list)
    began: float | None = None  # time of the first failure

    def spend(self, attempt: Attempt) -> None:
        """Counts one failed attempt; raises FailoverError once the budget is gone."""
        now = self.clock()
        self.began = now if self.began is None else self.began
        self.attempts.append(attempt)
        if len(self.attempts) > self.policy.max_retries:
            raise FailoverError(self.attempts, f"{self.policy.max_retries} retries allowed")
        if now - self.began > self.policy.retry_budget_s:
            raise FailoverError(self.attempts, f"{self.policy.retry_budget_s:.0f} s of retries allowed")

    def seconds_left(self) -> float:
        """Seconds of the time budget left (all of it before the first failure)."""
        if self.began is None:
            return self.policy.retry_budget_s
        return self.policy.retry_budget_s - (self.clock() - self.began)

    @property
    def used(self) -> int:
        return len(self.attempts)
