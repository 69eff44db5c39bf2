"""The pure parts of failover: backoff, bans, the per-call budget, step deadlines, kept inputs."""

import random

import pytest
import torch

from hexswarm.client.deadline import PeerSpeed, step_deadline_s
from hexswarm.client.history import InputHistory
from hexswarm.client.remote import PeerError
from hexswarm.client.retry import (
    RATE_LIMIT_DEFAULT_WAIT_S,
    RATE_LIMIT_MAX_WAIT_S,
    Attempt,
    BanList,
    FailoverError,
    RetryBudget,
    RetryPolicy,
    backoff_delay,
    rate_limit_wait,
)
from hexswarm.swarm.wire.protocol import ErrorCode


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_backoff_grows_with_jitter_and_is_capped():
    policy = RetryPolicy(backoff_base_s=0.1, backoff_max_s=1.0)
    rng = random.Random(0)
    assert backoff_delay(0, policy, rng) == 0.0  # the first attempt goes at once
    for attempt, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        delays = [backoff_delay(attempt, policy, rng) for _ in range(200)]
        assert all(cap / 2 <= d <= cap for d in delays)
        assert max(delays) - min(delays) > cap / 4  # jittered, not one fixed value


def test_ban_grows_on_each_new_failure_and_expires():
    clock = Clock()
    bans = BanList(RetryPolicy(ban_base_s=10, ban_factor=2, ban_max_s=35), clock=clock)
    assert bans.ban("p") == 10 and bans.banned() == {"p"}
    clock.now += 10.5
    assert bans.banned() == frozenset()  # expired
    assert bans.ban("p") == 20  # a second failure: twice as long
    assert bans.ban("p") == 35  # capped
    assert bans.ban("q") == 10  # per peer
    clock.now += 34
    assert bans.banned() == {"p"}


def test_budget_counts_attempts_and_seconds_and_lists_them():
    clock = Clock()
    budget = RetryBudget(RetryPolicy(max_retries=2, retry_budget_s=30), clock=clock)
    budget.spend(Attempt("alice", 0, 3, "UNREACHABLE: EOF"))
    budget.spend(Attempt("bob", 3, 6, "INTERNAL: boom"))
    with pytest.raises(FailoverError) as info:
        budget.spend(Attempt("(none)", 0, 6, "no route"))
    error = info.value
    assert isinstance(error, PeerError) and len(error.attempts) == 3
    for text in ("alice[0:3): UNREACHABLE: EOF", "bob[3:6): INTERNAL: boom", "2 retries allowed"):
        assert text in str(error)

    timed = RetryBudget(RetryPolicy(max_retries=100, retry_budget_s=30), clock=clock)
    timed.spend(Attempt("a", 0, 1, "x"))
    clock.now += 31
    with pytest.raises(FailoverError, match="30 s of retries"):
        timed.spend(Attempt("a", 0, 1, "x"))


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError):
        RetryPolicy(deadline_slack=0.5)
    with pytest.raises(ValueError):
        RetryPolicy(retry_budget_s=0)


def test_deadline_follows_announced_speed_with_a_floor():
    policy = RetryPolicy(deadline_slack=8, deadline_floor_s=1.0)
    fast = PeerSpeed(decode_ms_per_block=0.5, throughput=50_000, rtt_ms=2)
    assert step_deadline_s(fast, blocks=4, batch=1, tokens=1, policy=policy) == 1.0  # the floor
    slow = PeerSpeed(decode_ms_per_block=50, throughput=200, rtt_ms=100)
    # decode: 8 x 10 blocks x 50 ms + 100 ms = 4.1 s
    assert step_deadline_s(slow, 10, 1, 1, policy) == pytest.approx(4.1)
    # prefill of 400 tokens: 10 blocks x 400 / 200 tok/s = 20 s of compute, x 8 slack, + RTT
    assert step_deadline_s(slow, 10, 1, 400, policy) == pytest.approx(160.1)
    loaded = PeerSpeed(decode_ms_per_block=50, throughput=200, rtt_ms=100, open_sessions=1)
    assert step_deadline_s(loaded, 10, 1, 1, policy) == pytest.approx(8.1)  # shares its compute thread
    assert step_deadline_s(fast, 4, 1, 1, policy, failures=2) == 4.0  # doubles per failure spent
    assert step_deadline_s(fast, 4, 1, 1, policy, failures=50) == 16.0  # up to x16
    assert step_deadline_s(PeerSpeed(), 4, 1, 1, policy) == 1.0  # nothing known: the floor


def test_deadline_allows_for_the_steps_bytes_at_a_slow_home_link():
    policy = RetryPolicy(deadline_floor_s=1.0, min_link_bytes_per_s=1e6)
    fast = PeerSpeed(decode_ms_per_block=0.01, rtt_ms=80.0)
    decode = step_deadline_s(fast, 4, 1, 1, policy, payload_bytes=2 * 2304)
    assert decode == 1.0  # a decode step's few KB stay under the floor
    prefill = step_deadline_s(fast, 4, 1, 2048, policy, payload_bytes=2 * 32 * 2**20)  # 32 MiB each way
    assert prefill == pytest.approx(67.1, abs=0.1)
    with pytest.raises(ValueError):
        RetryPolicy(min_link_bytes_per_s=0)


def test_history_keeps_inputs_per_boundary_within_its_bound():
    per_boundary = 1 * 8 * 4 * 4  # batch x max_length x hidden x float32
    history = InputHistory(per_boundary, max_bytes=2 * per_boundary)
    history.keep([0, 3, 5])
    assert history.kept == [0, 3]  # room for two boundaries; 0 is always kept
    assert history.replay_start(5) == 3 and history.replay_start(2) == 0
    assert history.inputs(3) is None
    steps = [
        {0: torch.full((1, n, 4), float(i)), 3: torch.full((1, n, 4), -float(i)), 5: None}
        for i, n in enumerate((3, 1, 1))
    ]
    for step in steps:
        history.append(step)
    assert history.inputs(0).shape == (1, 5, 4) and history.inputs(3)[0, :, 0].tolist() == [0, 0, 0, -1, -2]
    assert history.nbytes == 2 * 5 * 4 * 4
    history.keep([0, 4])  # re-routed: boundary 3 is gone, 4 is new
    history.replace(4, torch.ones(1, 5, 4))
    assert history.kept == [0, 4] and history.inputs(4).shape == (1, 5, 4)


def test_history_gives_what_a_boundary_was_sent_only_when_kept_whole():
    history = InputHistory(bytes_per_boundary=1, max_bytes=10)
    history.keep([0, 4])
    like = torch.zeros(1, 1, 2)
    assert history.sent_before(4, 0, like).shape == (1, 0, 2)  # nothing sent yet: empty, not None
    history.append({0: torch.ones(1, 3, 2), 4: torch.ones(1, 3, 2)})
    assert history.sent_before(4, 3, like).shape == (1, 3, 2)
    assert history.sent_before(4, 5, like) is None  # missed tokens: cannot be replayed
    assert history.sent_before(2, 3, like) is None  # a boundary it does not keep


def test_a_boundary_kept_only_after_the_first_step_is_no_place_to_replay_from():
    """A route that changes mid-session (a disaggregated session's decode chain, or a repair)
    may start keeping a boundary that never saw the first tokens: no repair starts there until
    a replay gives it everything."""
    history = InputHistory(bytes_per_boundary=1, max_bytes=10)
    history.keep([0])
    history.append({0: torch.ones(1, 5, 2)})  # the prompt, seen at boundary 0 only
    history.keep([0, 4])
    history.append({0: torch.ones(1, 1, 2), 4: torch.ones(1, 1, 2)})
    assert history.replay_start(6) == 0  # not 4: it lacks the prompt
    assert history.sent_before(4, 6, torch.zeros(1, 1, 2)) is None
    history.replace(4, torch.ones(1, 6, 2))  # a replay through a new hop at 4 saw all six
    assert history.replay_start(6) == 4


def _refusal(code: ErrorCode, message: str) -> PeerError:
    return PeerError("p1", code, message)


def test_rate_limited_is_a_wait_of_what_the_peer_names():
    assert rate_limit_wait(_refusal(ErrorCode.RATE_LIMITED, "over 5 steps/s; retry in 120 ms")) == 0.12
    assert rate_limit_wait(_refusal(ErrorCode.RATE_LIMITED, "over 5 steps/s")) == RATE_LIMIT_DEFAULT_WAIT_S


def test_the_named_wait_is_clamped():
    assert rate_limit_wait(_refusal(ErrorCode.RATE_LIMITED, "retry in 9999999 ms")) == RATE_LIMIT_MAX_WAIT_S
    assert rate_limit_wait(_refusal(ErrorCode.RATE_LIMITED, "retry in 0 ms")) == 0.001


def test_other_errors_are_no_wait():
    for code in (ErrorCode.BUSY, ErrorCode.PEER_FAILED, None):
        assert rate_limit_wait(_refusal(code, "retry in 3 ms")) is None


def test_a_full_peer_is_avoided_a_while_without_counting_a_failure():
    """BUSY or REMOTE_LIMIT is back-pressure: routed around, but its next real ban stays the first."""
    clock = Clock()
    policy = RetryPolicy(ban_base_s=10, ban_factor=2)
    bans = BanList(policy, clock)
    bans.avoid("full", 5)
    assert bans.banned() == {"full"}
    clock.now += 5.1
    assert bans.banned() == frozenset()
    assert bans.ban("full") == 10  # not 20: being full was no failure
