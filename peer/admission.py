"""Admission control: what one remote may take of a peer, so that a flood from one remote
cannot starve the sessions the peer has already admitted.

Four limits, each refusal a typed error frame:

- streams per remote peer id (REMOTE_LIMIT): a remote cannot take all of the peer's stream slots;
- sessions per remote peer id (REMOTE_LIMIT): nor all of its session slots;
- KV cache per remote peer id (REMOTE_LIMIT): its open sessions together reserve at most
  `cache_share_per_remote` of the peer's cache (half by default; one session alone at most a
  quarter, peer/core.py), so one remote cannot hoard the cache with a few large sessions;
- steps per second per session (RATE_LIMITED): a token bucket of `steps_per_second` per
  second holding up to `burst_s` seconds' worth, so a session cannot monopolize the compute
  thread, while a normal generation (one step per token) never notices it.

The remote's identity is its libp2p peer id, which the transport authenticates, so a remote
cannot pose as another; it can make new identities, which is why the global limits
(peer/core.py: sessions, cache; peer/server.py: streams) still apply on top of these, and why
streams, sessions and cache are also capped per IP group (a /24 or /48, from the address the
remote's connection comes from: swarm/net/maddrs.py): identities cost nothing, addresses do. A
group may hold `group_factor` times what one remote may (2 by default: a household with two
machines is served whole), but never more than `group_max_share` (half) of the peer's sessions,
streams or cache: one machine posing as many leaves the other half to everyone else. Remotes on this machine's loopback have no group: a swarm on one
machine is one operator's.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any

from hexswarm.swarm.wire.protocol import ErrorCode, ProtocolError


@dataclass(frozen=True)
class AdmissionLimits:
    sessions_per_remote: int = 8  # open sessions one remote peer id may hold (0: no limit)
    steps_per_second: float = 100.0  # sustained steps per session (0: no limit)
    burst_s: float = 2.0  # a session may run ahead of the rate by this many seconds' steps
    extra_streams_per_remote: int = 4  # streams beyond one per session (pings, a stream being set up)
    cache_share_per_remote: float = 0.5  # of the peer's KV cache, over one remote's sessions (0: no limit)
    group_factor: float = 2.0  # an IP group may hold this many times one remote's share (0: no group caps)
    group_max_share: float = 0.5  # ... and at most this share of the peer's sessions, streams, cache

    @property
    def streams_per_remote(self) -> int:
        return self.sessions_per_remote + self.extra_streams_per_remote if self.sessions_per_remote else 0


@dataclass
class _Bucket:
    tokens: float
    updated: float = field(default_factory=time.monotonic)


class Admission:
    """Counts what each remote holds and refuses what is over its limits."""

    def __init__(self, limits: AdmissionLimits):
        self.limits = limits
        self.streams: Counter[str] = Counter()  # remote -> open streams
        self.owners: dict[str, str] = {}  # session id -> remote that opened it
        self.buckets: dict[str, _Bucket] = {}  # session id -> its step budget
        self.groups: dict[str, str] = {}  # remote -> its IP group, while it holds a stream

    def enter_stream(self, remote: str, group: str | None = None, peer_streams: int = 0) -> None:
        """Counts a new stream of `remote` (of IP `group`, None on loopback) on a peer of
        `peer_streams` stream slots (0: unknown); raises REMOTE_LIMIT if it, or its group,
        holds too many."""
        cap = self.limits.streams_per_remote
        if cap and self.streams[remote] >= cap:
            raise ProtocolError(ErrorCode.REMOTE_LIMIT, f"one remote may hold {cap} streams to this peer")
        group_cap = self._group_cap(cap, peer_streams)
        if group is not None and group_cap:
            held = sum(n for r, n in self.streams.items() if self.groups.get(r) == group)
            if held >= group_cap:
                raise ProtocolError(
                    ErrorCode.REMOTE_LIMIT, f"the IP group {group} may hold {group_cap} streams to this peer"
                )
        if group is not None:
            self.groups[remote] = group
        self.streams[remote] += 1

    def leave_stream(self, remote: str) -> None:
        self.streams[remote] -= 1
        if self.streams[remote] <= 0:
            del self.streams[remote]
            self.groups.pop(remote, None)

    def check_open(
        self,
        remote: str,
        open_sessions: Mapping[str, Any] | Container[str],
        needed_tokens: int = 0,
        cache_tokens: int = 0,
        session_tokens: int = 0,
        peer_sessions: int = 0,
    ) -> None:
        """Raises REMOTE_LIMIT if `remote` already holds its share of the sessions still open
        (on a peer of `peer_sessions` session slots; 0: unknown), or
        if a new session of `needed_tokens` would take it over its share of `cache_tokens`. The
        share is never less than what one session may reserve (`session_tokens`): a peer whose
        cache holds one or two sessions (`run-peer --max-sessions 1`) still serves a whole one."""
        self._forget_closed(open_sessions)
        held = [session for session, owner in self.owners.items() if owner == remote]
        cap = self.limits.sessions_per_remote
        share = self.limits.cache_share_per_remote
        self._check_share(
            "one remote", held, open_sessions, needed_tokens, cache_tokens, session_tokens, cap, share
        )
        group = self.groups.get(remote)
        if group is not None and self.limits.group_factor:
            held = [s for s, owner in self.owners.items() if self.groups.get(owner) == group]
            share = min(self.limits.group_factor * share, self.limits.group_max_share)
            cap = self._group_cap(cap, peer_sessions)
            self._check_share(
                f"the IP group {group}",
                held,
                open_sessions,
                needed_tokens,
                cache_tokens,
                session_tokens,
                cap,
                share,
            )

    def _check_share(
        self,
        who: str,
        held: list[str],
        open_sessions,
        needed_tokens: int,
        cache_tokens: int,
        session_tokens: int,
        cap: int,
        cache_share: float,
    ) -> None:
        """REMOTE_LIMIT if `who`, holding sessions `held`, is at its session `cap` (0: none), or
        would go over `cache_share` of the cache."""
        if cap and len(held) >= cap:
            raise ProtocolError(
                ErrorCode.REMOTE_LIMIT, f"{who} may hold {cap} sessions on this peer; close one first"
            )
        share = int(min(1.0, cache_share) * cache_tokens)
        if not share:
            return
        share = max(share, session_tokens)
        reserved = sum(open_sessions[session].reserved_tokens for session in held)
        if reserved + needed_tokens > share:
            raise ProtocolError(
                ErrorCode.REMOTE_LIMIT,
                f"{who} may reserve {share} cache tokens on this peer; it holds {reserved}, "
                f"asks {needed_tokens} more",
            )

    def _group_cap(self, per_remote: int, peer_total: int) -> int:
        """What one IP group may hold: group_factor remotes' worth, at most group_max_share of
        the peer's `peer_total` (when known), and at least one."""
        cap = int(self.limits.group_factor * per_remote)
        if peer_total > 0:
            ceiling = max(1, int(self.limits.group_max_share * peer_total))
            cap = min(cap, ceiling) if cap else ceiling
        return cap

    def opened(self, remote: str, session_id: str) -> None:
        self.owners[session_id] = remote
        self.buckets[session_id] = _Bucket(tokens=self._capacity)

    def check_step(self, session_id: str, now: float | None = None) -> None:
        """Takes one step from the session's bucket; raises RATE_LIMITED when it is empty."""
        rate = self.limits.steps_per_second
        bucket = self.buckets.get(session_id)
        if not rate or bucket is None:
            return
        now = time.monotonic() if now is None else now
        bucket.tokens = min(self._capacity, bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens < 1.0:
            wait_ms = 1000 * (1.0 - bucket.tokens) / rate
            raise ProtocolError(
                ErrorCode.RATE_LIMITED, f"over {rate:g} steps/s for this session; retry in {wait_ms:.0f} ms"
            )
        bucket.tokens -= 1.0

    @property
    def _capacity(self) -> float:
        return max(1.0, self.limits.steps_per_second * self.limits.burst_s)

    def _forget_closed(self, open_sessions: Container[str]) -> None:
        # Sessions end in peer/core.py (close, disconnect, idle expiry); forget them lazily here.
        for session_id in [s for s in self.owners if s not in open_sessions]:
            del self.owners[session_id]
            self.buckets.pop(session_id, None)
