"""What a stranger's evidence request may take of a peer, decided before its body is read.

Who can reach it: any node of the swarm, under as many identities as it likes, from as many
addresses as it owns. What it costs them: a few bytes (a length prefix announcing 64 MiB, or
a ~100-byte GET that pulls 64 MiB back). What bounds it, each limit for one threat:

- size: a request is at most MAX_WIRE_EVIDENCE_BYTES plus a header, judged from its length
  prefix before a byte of it is read (peer/evidence_service.py);
- slots: at most `max_held` requests hold evidence bytes at once (a submission from the moment
  its length is read until it is answered; a fetch while its reply is sent), and at most
  `max_held_per_group` of them come from one IP group: the memory is bounded by max_held x
  64 MiB (plus the parsed copies), and one machine cannot take every slot;
- rates: submissions and fetches a minute per remote and per IP group (token buckets,
  swarm/trust/rates.py), taken before anything is parsed: identities cost nothing, addresses do;
- bytes: the submission bytes a minute per IP group (else per remote) and for all strangers
  together, taken from the length prefix before the body is read: reading and parsing 64 MiB
  costs a peer's event loop and memory whatever is inside (a flood of maximal evidence that
  the count rates let through still slowed honest requests' p99 9 x, docs/benchmarks.md); and
  likewise the bytes fetches pull, taken from the file's size before it is read (`take_sent`);
- compute: the rows x tokens re-checked a minute per IP group (else per remote), taken once the
  evidence's shape is known and before it is re-checked (`take_recheck`): a group sending the
  largest evidence the rates let through gets one such re-check every two minutes per peer,
  and all strangers together four.

Every limit is checked and taken in one synchronous call (`admit`), so no await separates a
check from its take. A remote on this machine's loopback has no group (peer/admission.py): only
the limits per remote and the total apply to it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hexswarm.swarm.trust.evidence import MAX_EVIDENCE_TOKENS
from hexswarm.swarm.trust.evidence_wire import MAX_REQUEST_HEADER_BYTES, MAX_WIRE_EVIDENCE_BYTES
from hexswarm.swarm.trust.rates import KeyedRate
from hexswarm.swarm.wire.checks import ErrorCode, ProtocolError

SUBMIT, GET = "submit", "get"
LARGEST_SUBMISSION = MAX_WIRE_EVIDENCE_BYTES + MAX_REQUEST_HEADER_BYTES
ALL = "*"  # the key of the budget every remote shares


@dataclass(frozen=True)
class EvidenceLimits:
    """How much re-checking and handing out a peer does for others."""

    submits_per_minute_per_remote: float = 2.0
    submits_per_minute_per_group: float = 6.0  # identities cost nothing, machines do
    gets_per_minute_per_remote: float = 6.0
    gets_per_minute_per_group: float = 12.0  # each GET may send 64 MiB
    max_waiting: int = 2  # re-checks queued behind the running one; more are refused BUSY
    max_held: int = 4  # requests holding evidence bytes at once (each up to 64 MiB)
    max_held_per_group: int = 2  # ... of them from one IP group
    # the largest re-check (MAX_EVIDENCE_TOKENS rows x tokens) takes a group's whole burst (two
    # minutes' worth), and four groups' worth all strangers together; a client's evidence is
    # one step's, and it sends it to several peers
    recheck_tokens_per_minute_per_group: float = MAX_EVIDENCE_TOKENS / 2
    recheck_tokens_per_minute: float = 2 * MAX_EVIDENCE_TOKENS
    # bursts of two minutes' worth: two of the largest submissions, then one a minute per group,
    # and two a minute from all strangers together
    submit_bytes_per_minute_per_group: float = LARGEST_SUBMISSION
    submit_bytes_per_minute: float = 2 * LARGEST_SUBMISSION


class EvidenceGate:
    """Counts the slots held per IP group and the rates per remote and group; refuses what is
    over a limit with a typed error, counting nothing for it."""

    def __init__(self, limits: EvidenceLimits):
        self.limits = limits
        self.rates = {  # kind -> (per remote, per group)
            SUBMIT: (
                KeyedRate(limits.submits_per_minute_per_remote),
                KeyedRate(limits.submits_per_minute_per_group),
            ),
            GET: (KeyedRate(limits.gets_per_minute_per_remote), KeyedRate(limits.gets_per_minute_per_group)),
        }
        self.recheck = _Budget(
            limits.recheck_tokens_per_minute_per_group,
            limits.recheck_tokens_per_minute,
            f"this network's re-check budget ({limits.recheck_tokens_per_minute_per_group:.0f} tokens a "
            "minute) does not cover {cost} tokens now",
            "re-checked as much evidence as it may for now; retry later",
        )
        bytes_over = "this network's evidence bytes a minute do not cover {cost} bytes now"
        self.submit_bytes = _Budget(
            limits.submit_bytes_per_minute_per_group,
            limits.submit_bytes_per_minute,
            bytes_over,
            "read as much evidence as it may for now; retry later",
        )
        self.sent_bytes = _Budget(  # fetches: budgets of the same size
            limits.submit_bytes_per_minute_per_group,
            limits.submit_bytes_per_minute,
            bytes_over,
            "sent as much evidence as it may for now; retry later",
        )
        self.held: Counter[str | None] = Counter()  # IP group (None: loopback) -> slots it holds

    def admit(self, kind: str, remote: str, group: str | None, now: float, size: int = 0) -> None:
        """Counts one request of `kind` (SUBMIT or GET) of `size` bytes by `remote` from IP
        `group` and gives it a slot, which the caller gives back with `release(group)`; raises
        RATE_LIMITED or BUSY."""
        if kind not in self.rates:
            raise ValueError(f"unknown kind of evidence request {kind!r}")
        per_remote, per_group = self.rates[kind]
        if not per_remote.allows(remote, now) or (group is not None and not per_group.allows(group, now)):
            raise ProtocolError(
                ErrorCode.RATE_LIMITED, "too many evidence requests from this remote or its network"
            )
        sized = kind == SUBMIT and size > 0
        if sized:
            self.submit_bytes.check(group or remote, now, size)
        if sum(self.held.values()) >= self.limits.max_held:
            raise ProtocolError(ErrorCode.BUSY, "handling other evidence requests; retry later")
        if group is not None and self.held[group] >= self.limits.max_held_per_group:
            raise ProtocolError(
                ErrorCode.BUSY, f"the IP group {group} has {self.held[group]} evidence requests here"
            )
        per_remote.take(remote, now)
        if group is not None:
            per_group.take(group, now)
        if sized:
            self.submit_bytes.take(group or remote, now, size)
        self.held[group] += 1

    def release(self, group: str | None) -> None:
        """Gives back a slot `admit` gave a request of IP `group`."""
        if self.held[group] <= 1:
            self.held.pop(group, None)
        else:
            self.held[group] -= 1

    def take_recheck(self, remote: str, group: str | None, tokens: int, now: float) -> None:
        """Takes `tokens` (rows x tokens) of re-check compute from the budget of `group` (else of
        `remote`) and of all strangers, or raises RATE_LIMITED or BUSY taking nothing."""
        self.recheck.check(group or remote, now, tokens)
        self.recheck.take(group or remote, now, tokens)

    def take_sent(self, remote: str, group: str | None, size: int, now: float) -> None:
        """Takes `size` bytes a fetch is about to send from the budget of `group` (else of
        `remote`) and of all strangers, or raises RATE_LIMITED or BUSY taking nothing."""
        self.sent_bytes.check(group or remote, now, size)
        self.sent_bytes.take(group or remote, now, size)


class _Budget:
    """An amount a minute per IP group (else per remote), and one that all strangers share."""

    def __init__(self, per_group: float, shared: float, over_group: str, over_shared: str):
        self.per_group, self.shared = KeyedRate(per_group), KeyedRate(shared)
        self.over_group = over_group  # the RATE_LIMITED message; `{cost}` is filled in
        self.over_shared = over_shared  # the BUSY message

    def check(self, key: str, now: float, cost: float) -> None:
        """Raises RATE_LIMITED or BUSY, counting nothing, unless both budgets cover `cost`."""
        if not self.per_group.allows(key, now, cost):
            raise ProtocolError(ErrorCode.RATE_LIMITED, self.over_group.format(cost=cost))
        if not self.shared.allows(ALL, now, cost):
            raise ProtocolError(ErrorCode.BUSY, self.over_shared)

    def take(self, key: str, now: float, cost: float) -> None:
        """Counts `cost` against both budgets (after `check`)."""
        self.per_group.take(key, now, cost)
        self.shared.take(ALL, now, cost)
