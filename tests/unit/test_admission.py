"""Admission limits per remote and per session (peer/admission.py)."""

import pytest

from hexswarm.peer.admission import Admission, AdmissionLimits
from hexswarm.swarm.protocol import ErrorCode, ProtocolError


def _code(call, *args):
    with pytest.raises(ProtocolError) as error:
        call(*args)
    return error.value.code


def test_sessions_per_remote_counts_only_sessions_still_open():
    admission = Admission(AdmissionLimits(sessions_per_remote=2))
    open_sessions = {"a", "b"}
    for sid in open_sessions:
        admission.check_open("mallory", open_sessions)
        admission.opened("mallory", sid)
    assert _code(admission.check_open, "mallory", open_sessions) == ErrorCode.REMOTE_LIMIT
    admission.check_open("alice", open_sessions)  # another remote is not affected
    open_sessions.discard("a")  # closed, dropped or expired in PeerCore
    admission.check_open("mallory", open_sessions)


def test_streams_per_remote():
    admission = Admission(AdmissionLimits(sessions_per_remote=1, extra_streams_per_remote=1))
    admission.enter_stream("m")
    admission.enter_stream("m")
    assert _code(admission.enter_stream, "m") == ErrorCode.REMOTE_LIMIT
    admission.enter_stream("other")
    admission.leave_stream("m")
    admission.enter_stream("m")


def test_step_rate_is_a_token_bucket():
    admission = Admission(AdmissionLimits(steps_per_second=10, burst_s=1.0))
    admission.opened("r", "s")
    now = 1e9  # far after the bucket was filled: it is full (10 steps)
    for _ in range(10):
        admission.check_step("s", now)
    assert _code(admission.check_step, "s", now) == ErrorCode.RATE_LIMITED
    admission.check_step("s", now + 0.1)  # 0.1 s refills one step
    assert _code(admission.check_step, "s", now + 0.1) == ErrorCode.RATE_LIMITED


def test_zero_means_no_limit():
    admission = Admission(AdmissionLimits(sessions_per_remote=0, steps_per_second=0))
    for i in range(100):
        admission.enter_stream("r")
        admission.check_open("r", set(admission.owners))
        admission.opened("r", str(i))
        admission.check_step(str(i), 0.0)


def test_one_remote_reserves_at_most_its_share_of_the_cache():
    from types import SimpleNamespace

    admission = Admission(AdmissionLimits(sessions_per_remote=8, cache_share_per_remote=0.5))
    sessions = {}
    for sid, tokens in (("a", 8000), ("b", 8000)):
        admission.check_open("mallory", sessions, tokens, cache_tokens=32768)
        admission.opened("mallory", sid)
        sessions[sid] = SimpleNamespace(reserved_tokens=tokens)
    # 16,000 held: 384 more fit in half of 32,768, 1,000 do not.
    admission.check_open("mallory", sessions, 384, cache_tokens=32768)
    assert _code(admission.check_open, "mallory", sessions, 1000, 32768) == ErrorCode.REMOTE_LIMIT
    admission.check_open("alice", sessions, 16000, cache_tokens=32768)  # another remote's share is whole
    del sessions["a"]
    admission.check_open("mallory", sessions, 8000, cache_tokens=32768)


def test_a_remote_may_always_reserve_one_whole_session():
    """With --max-sessions 1 the cache is one session long: half of it would refuse every
    session longer than half the peer's --max-length, to every client."""
    admission = Admission(AdmissionLimits(cache_share_per_remote=0.5))
    admission.check_open("alice", {}, 2048, cache_tokens=2048, session_tokens=2048)
    assert _code(admission.check_open, "alice", {}, 2048, 2048) == ErrorCode.REMOTE_LIMIT  # no floor
