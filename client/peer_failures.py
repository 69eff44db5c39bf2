"""What a session remembers of failed peers: bans, the peers that failed in this call, the
retry budget the failures spend, and one timed record per recovery.

Two kinds of refusal are told apart. A peer that failed (died, stalled past its deadline,
answered garbage) is banned (client.retry.BanList) and forgotten by the client's dialer; a
peer that refused with back-pressure (BUSY or REMOTE_LIMIT: it is full) is only routed around
for a while, with no failure counted against it. Either way the attempt is spent from the
call's budget (client.retry.RetryBudget), which raises FailoverError when it is gone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from hexswarm.client.known_peers import KnownPeers
from hexswarm.client.remote import PeerError
from hexswarm.client.retry import BACK_PRESSURE, Attempt, BanList, RetryBudget, RetryPolicy
from hexswarm.client.swarm_client import SwarmClient
from hexswarm.swarm.wire.protocol import ErrorCode

logger = logging.getLogger(__name__)


@dataclass
class Failover:
    """One recovery, timed: for the benchmark and the logs."""

    peer: str
    start: int
    end: int
    error: str
    detected: float  # time.monotonic() when the error reached the client
    recovered: float = 0.0  # when the repaired span had produced the step's output
    attempts: int = 1


@dataclass
class PeerFailures:
    """Bans and failures of one session; `budget` bounds its retries (and, through the step
    deadlines, grows them: client.deadline)."""

    swarm: SwarmClient
    peers: KnownPeers
    policy: RetryPolicy
    bans: BanList
    budget: RetryBudget = None
    failed_here: set[str] = field(default_factory=set)  # peers that failed in this session

    def __post_init__(self) -> None:
        self.budget = self.budget or RetryBudget(self.policy)

    def failed(
        self, peer_id: str | None, start: int, end: int, error: str, code: ErrorCode | None = None
    ) -> None:
        """Bans the peer (if any) and spends one attempt; raises FailoverError when the budget is
        gone. A peer that refused with back-pressure (`code` BUSY or REMOTE_LIMIT: it is full) is
        only routed around for a while: no ban, no failure counted against it."""
        name = self.peers.name(peer_id) if peer_id else "(none)"
        if peer_id is not None and code in BACK_PRESSURE:
            self.bans.avoid(peer_id, self.policy.busy_avoid_s)
            logger.info(
                "peer %s is full for blocks [%d:%d) (%s); routing around it for %.0f s",
                name,
                start,
                end,
                error,
                self.policy.busy_avoid_s,
            )
        elif peer_id is not None:
            self.failed_here.add(peer_id)
            ban_s = self.bans.ban(peer_id)
            self.swarm.forget(peer_id)
            logger.info(
                "peer %s failed on blocks [%d:%d): %s; banned for %.0f s", name, start, end, error, ban_s
            )
        self.budget.spend(Attempt(name, start, end, error))

    def forgive(self, peer_id: str) -> None:
        """A peer that failed in this call answers again (e.g. its connection went through a
        relay that died, and another relay reaches it): it may serve this call again."""
        self.failed_here.discard(peer_id)
        self.bans.lift(peer_id)

    def new_failover(self, peer_id: str | None, start: int, end: int, error: PeerError) -> Failover:
        """The record of a recovery that starts now, from `error` on blocks [start, end)."""
        name = self.peers.name(peer_id) if peer_id else "?"
        return Failover(name, start, end, short_error(error), time.monotonic())


def short_error(error: PeerError) -> str:
    """'CODE: message', the message cut to 200 characters (UNREACHABLE when no peer answered)."""
    what = error.code.name if error.code is not None else "UNREACHABLE"
    return f"{what}: {error.message[:200]}"
