"""Admission limits per remote and per session (peer/admission.py)."""

import pytest

from hexswarm.peer.admission import Admission, AdmissionLimits
from hexswarm.swarm.wire.protocol import ErrorCode, ProtocolError


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


def test_identities_of_one_ip_group_share_twice_one_remotes_streams():
    admission = Admission(AdmissionLimits(sessions_per_remote=1, extra_streams_per_remote=1))  # 2 a remote
    for sybil in ("s1", "s1", "s2", "s2"):
        admission.enter_stream(sybil, "10.0.1.0/24")
    assert _code(admission.enter_stream, "s3", "10.0.1.0/24") == ErrorCode.REMOTE_LIMIT
    admission.enter_stream("s3", "10.0.2.0/24")  # another network is not affected
    admission.enter_stream("local", None)  # nor loopback, which has no group
    admission.leave_stream("s1")
    admission.enter_stream("s3", "10.0.1.0/24")


def test_identities_of_one_ip_group_share_twice_one_remotes_sessions_and_cache():
    class Session:
        reserved_tokens = 1000

    admission = Admission(AdmissionLimits(sessions_per_remote=2, cache_share_per_remote=0.25))
    open_sessions = {}
    for i, sybil in enumerate(("s1", "s2", "s3", "s4", "s5")):
        admission.enter_stream(sybil, "10.0.1.0/24")
        if i == 4:  # 4 sessions a group: 2 x 2 a remote
            assert _code(admission.check_open, sybil, open_sessions, 100, 10_000) == ErrorCode.REMOTE_LIMIT
            break
        admission.check_open(sybil, open_sessions, 100, 10_000)
        admission.opened(sybil, f"{sybil}/x")
        open_sessions[f"{sybil}/x"] = Session()
    # the cache: one remote may reserve 25% = 2,500 of 10,000 tokens, a group 2 x 25% = 5,000
    admission.enter_stream("t", "10.0.3.0/24")
    assert (
        _code(admission.check_open, "t", open_sessions, 2600, 10_000) == ErrorCode.REMOTE_LIMIT
    )  # one remote
    del open_sessions["s1/x"]
    admission.check_open("s5", open_sessions, 100, 10_000)
    admission.enter_stream("u", "10.0.1.0/24")
    with pytest.raises(ProtocolError, match="IP group 10.0.1.0/24 may reserve"):
        admission.check_open("u", open_sessions, 2400, 10_000)  # 3,000 held + 2,400 > 5,000


def test_one_ip_group_never_holds_over_half_of_a_peer():
    # 8 sessions a remote, 16 a group by the factor: but the peer has 16 slots, and a machine
    # posing as many must leave half of them (and of the streams) to everyone else
    admission = Admission(AdmissionLimits(sessions_per_remote=8))
    for i in range(10):
        admission.enter_stream(f"sybil-{i}", "10.0.1.0/24", peer_streams=64)
    open_sessions = set()
    for i in range(8):
        admission.check_open(f"sybil-{i}", open_sessions, peer_sessions=16)
        admission.opened(f"sybil-{i}", f"s{i}")
        open_sessions.add(f"s{i}")
    with pytest.raises(ProtocolError, match="IP group 10.0.1.0/24 may hold 8 sessions"):
        admission.check_open("sybil-9", open_sessions, peer_sessions=16)
    for i in range(10, 24):  # streams: 2 x 12 a remote = 24, under half of 64 slots
        admission.enter_stream(f"sybil-{i}", "10.0.1.0/24", peer_streams=64)
    with pytest.raises(ProtocolError, match="may hold 24 streams"):
        admission.enter_stream("sybil-24", "10.0.1.0/24", peer_streams=64)
    few = Admission(AdmissionLimits(sessions_per_remote=8))
    for i in range(8):  # a peer of 16 stream slots: half of them
        few.enter_stream(f"sybil-{i}", "10.0.1.0/24", peer_streams=16)
    with pytest.raises(ProtocolError, match="may hold 8 streams"):
        few.enter_stream("sybil-8", "10.0.1.0/24", peer_streams=16)
    admission.enter_stream("honest", "10.0.2.0/24", peer_streams=64)
    admission.check_open("honest", open_sessions, peer_sessions=16)
