"""Choosing a session's chains: which peers serve which blocks, leaving failed peers out.

Any router (routing.chains) chooses, on a view of the peers this session may use
(routing.chains.span: on a sub-view when only blocks [start, end) are repaired; the new chain
may split the span differently, e.g. one peer replaced by two). Banned peers are left out and
not even pinged; when that leaves no chain, only the peers that failed in this call are, since
a ban from an earlier call is a preference, not a wall. While no chain exists at all, the DHT
is read again until peers cover the span or the time runs out: a restarting or joining peer
is worth the wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from hexswarm.client.known_peers import KnownPeers
from hexswarm.client.peer_failures import PeerFailures
from hexswarm.client.retry import SpanUnservedError
from hexswarm.client.swarm_client import PING_TIMEOUT_S, MissingBlocksError, SwarmClient
from hexswarm.routing.chains.span import route_span
from hexswarm.routing.chains.swarm_view import NoRouteError, Route, Router, RouteRequest
from hexswarm.swarm.models.model_spec import ModelSpec
from hexswarm.swarm.trust.records import PeerRecord

logger = logging.getLogger(__name__)

WAIT_POLL_S = 0.5  # how often the DHT is read while no chain exists
REVIVE_PING_S = 1.5  # how long a peer that failed on a span gets to answer a ping again


class NoChainError(MissingBlocksError):
    """Every block has peers, but no chain of eligible ones formed within the coverage timeout
    (all busy, out of KV cache, or failed in this call); says why, as the router did."""

    def __init__(self, model_id: str, error: NoRouteError):
        self.model_id, self.missing = model_id, list(error.missing_blocks)
        RuntimeError.__init__(self, f"no chain of eligible peers for {model_id}: {error}")


@dataclass
class ChainChooser:
    """Chooses the chains of one session with the client's router."""

    swarm: SwarmClient
    router: Router
    spec: ModelSpec
    request: RouteRequest
    peers: KnownPeers
    failures: PeerFailures
    # Steps are pushed from peer to peer: chains are priced by the links between their peers
    # that the peers measured (routing/chains/peer_links.py), not only by the client's round trips.
    pushed: bool = True
    ping_timeout: float = PING_TIMEOUT_S  # for peers the client has not measured yet
    # While a session opens: when (time.monotonic()) finding no chain ends the call, the
    # session's coverage timeout, rather than the whole retry budget (None: the budget alone).
    no_route_deadline: float | None = None
    # Whole-model routes the router chose for this session: a router that counts its own picks
    # as load (the trade-off router) is told when the session ends (`release`).
    picked: list[Route] = field(default_factory=list)

    def no_route_past_deadline(self) -> bool:
        """Whether finding no chain now ends the call (the session's coverage timeout ran out)."""
        return self.no_route_deadline is not None and time.monotonic() >= self.no_route_deadline

    async def route(self, start: int, end: int, formats: dict[int, str] | None) -> Route:
        """A chain over blocks [start, end) (see `choose`); NoRouteError if none forms."""
        # Off the loop: measuring new peers' round trips and the router's own work may take a while.
        return await asyncio.to_thread(self.choose, start, end, formats)

    def choose(self, start: int, end: int, formats: dict[int, str] | None = None) -> Route:
        """A chain without banned peers; failing that, one that avoids only the peers that
        failed in this call (a ban from an earlier call is a preference, not a wall)."""
        banned = self.failures.bans.banned()
        failed_here = self.failures.failed_here
        try:
            return self._choose_without(banned, start, end, formats)
        except NoRouteError:
            if banned <= failed_here:
                raise
            logger.info(
                "no chain for [%d:%d) without banned peers; trying those banned before this call", start, end
            )
            return self._choose_without(banned & failed_here, start, end, formats)

    def _choose_without(
        self, exclude: frozenset[str], start: int, end: int, formats: dict[int, str] | None
    ) -> Route:
        records = [r for r in self.peers.records.values() if same_format(r, start, end, formats)]
        return self._route_through(records, exclude, start, end)

    def route_among(self, records: list[PeerRecord]) -> Route:
        """A chain over every block through `records` only (one phase's peers of a disaggregated
        request), without banned peers; NoRouteError if they cannot form one."""
        return self._route_through(records, self.failures.bans.banned(), 0, self.spec.num_blocks)

    def _route_through(
        self, records: list[PeerRecord], exclude: frozenset[str], start: int, end: int
    ) -> Route:
        """The router's chain over blocks [start, end) among `records`, leaving `exclude` out
        (they are not pinged either)."""
        allowed = [r for r in records if r.peer_id not in exclude]
        view = self.swarm.view(
            allowed, self.spec.num_blocks, self.spec.hidden_size, self.ping_timeout, peer_links=self.pushed
        )
        route = route_span(self.router, view, self.request, start, end, exclude)
        if (start, end) == (0, self.spec.num_blocks):
            self.picked.append(route)
        return route

    def release(self) -> None:
        """The session ends: the routes it took stop counting as this client's load."""
        release = getattr(self.router, "release", None)
        for route in self.picked if release is not None else ():
            release(route)
        self.picked.clear()

    def _failed_ones_answer(self, start: int, end: int) -> bool:
        """Pings the peers that failed in this call on blocks [start, end); forgives those that
        answer (dialed at any of their record's addresses, e.g. another relay's port)."""
        failed = [
            r
            for r in self.peers.records.values()
            if r.peer_id in self.failures.failed_here and r.start < end and r.end > start
        ]
        answered = self.swarm.round_trips(failed, REVIVE_PING_S) if failed else {}
        for peer_id in answered:
            logger.info(
                "peer %s answers again after failing; it may serve blocks [%d:%d)",
                self.peers.name(peer_id),
                start,
                end,
            )
            self.failures.forgive(peer_id)
        return bool(answered)

    async def wait_for_peers(self, start: int, end: int) -> None:
        """Polls the DHT until peers other than this call's failed ones cover [start, end),
        for at most the time budget left: a peer restarting or joining counts one attempt.
        Once the session is open, a span that no peer announces at all is waited for only
        `replacement_wait_s` (then SpanUnservedError), so that a dead span is told in seconds;
        meanwhile the peers that failed on it are pinged each round, and one that answers (its
        relay died, not the peer: it answers at another relay's address once a dial gets
        through, or once its record names the relays it has left) may serve it again."""
        began = time.monotonic()
        while True:
            await asyncio.to_thread(self.peers.refresh)
            served = {
                b
                for r in self.peers.records.values()
                if r.peer_id not in self.failures.failed_here
                for b in range(r.start, r.end)
            }
            if served >= set(range(start, end)):
                return
            if self.no_route_deadline is None and await asyncio.to_thread(
                self._failed_ones_answer, start, end
            ):
                return
            waited = time.monotonic() - began
            if self.no_route_deadline is None and waited >= self.failures.policy.replacement_wait_s:
                unserved = sorted(set(range(start, end)) - served)
                first, last = unserved[0], unserved[-1] + 1
                raise SpanUnservedError(
                    self.failures.budget.attempts, self.spec.model_id, first, last, waited
                )
            if self.failures.budget.seconds_left() <= WAIT_POLL_S or self.no_route_past_deadline():
                return
            await asyncio.sleep(WAIT_POLL_S)


def same_format(record: PeerRecord, start: int, end: int, formats: dict[int, str] | None) -> bool:
    """Whether `record` stores every block it would serve of [start, end) in the format that
    block had before (`formats`; None: any format the client accepts)."""
    if formats is None:
        return True
    overlap = range(max(record.start, start), min(record.end, end))
    return all(formats.get(block, record.quant) == record.quant for block in overlap)
