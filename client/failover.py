"""Opening hops and replacing failed ones: the part of a session that talks to peers.

`Hops.replace(start, end, inputs)` is the one repair operation, used both to open a session
(blocks [0, L), nothing to replay) and to repair a failed hop:

1. route blocks [start, end) with the client's router, excluding banned peers
   (routing.chains.span: any router, on a sub-view; the new chain may split the span
   differently, e.g. one peer replaced by two);
2. open a session on each new hop;
3. push `inputs` (every hidden state the span has seen, the current step's included)
   through the new hops as prefill, chained, so each rebuilds its KV cache;
4. on any peer error, ban that peer, count the attempt against the call's budget
   (client.retry), back off and start again at 1.

Every request carries a deadline from the peer's announced speed (client.deadline), so a
stalled peer costs about a second, not a fixed minute.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from dataclasses import dataclass, field

import torch

from hexswarm.client.deadline import PeerSpeed, step_deadline_s, transfer_s
from hexswarm.client.remote import PeerConnection, PeerError, random_session_id
from hexswarm.client.retry import (
    BACK_PRESSURE,
    Attempt,
    BanList,
    RetryBudget,
    RetryPolicy,
    backoff_delay,
)
from hexswarm.client.swarm_client import PING_TIMEOUT_S, MissingBlocksError, SwarmClient
from hexswarm.routing.chains.span import route_span
from hexswarm.routing.chains.swarm_view import Hop, NoRouteError, Route, Router, RouteRequest
from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT
from hexswarm.swarm.model_spec import ModelSpec
from hexswarm.swarm.protocol import MAX_ACK_MS, ErrorCode, KvTarget, NextHop, Step
from hexswarm.swarm.records import PeerRecord

logger = logging.getLogger(__name__)

WAIT_POLL_S = 0.5  # how often the DHT is read while no chain exists
REPLAY_CHUNK_BYTES = 16 << 20  # one replay frame at most (peers accept 64 MiB by default)


@dataclass
class LiveHop:
    """One hop of the current chain: blocks [start, end) in a session on one peer."""

    hop: Hop
    conn: PeerConnection
    session_id: str  # one per hop: a peer may serve two hops of one chain
    upstream: str = ""  # the peer its session takes pushed steps from ("" = none): the hop before it at open
    quant: str = DEFAULT_QUANT  # the weight format its peer announced when the hop opened
    pushed: bool = False  # its peer has pushed this session's output on: its link to the next is open

    @property
    def start(self) -> int:
        return self.hop.start

    @property
    def end(self) -> int:
        return self.hop.end


class NoChainError(MissingBlocksError):
    """Every block has peers, but no chain of eligible ones formed within the coverage timeout
    (all busy, out of KV cache, or failed in this call); says why, as the router did."""

    def __init__(self, model_id: str, error: NoRouteError):
        self.model_id, self.missing = model_id, list(error.missing_blocks)
        RuntimeError.__init__(self, f"no chain of eligible peers for {model_id}: {error}")


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
class Hops:
    """Opens, runs and replaces the hops of one session (all on the client loop)."""

    swarm: SwarmClient
    router: Router
    spec: ModelSpec
    request: RouteRequest
    session_id: str
    dtype: torch.dtype
    policy: RetryPolicy
    bans: BanList
    records: dict[str, PeerRecord]  # peer id -> its record, as last read
    budget: RetryBudget = None
    rng: random.Random = field(default_factory=random.Random)
    ping_timeout: float = PING_TIMEOUT_S  # for peers the client has not measured yet
    failed_here: set[str] = field(default_factory=set)  # peers that failed in this session
    # While a session opens: when (time.monotonic()) finding no chain ends the call, the
    # session's coverage timeout, rather than the whole retry budget (None: the budget alone).
    no_route_deadline: float | None = None

    def __post_init__(self) -> None:
        self.budget = self.budget or RetryBudget(self.policy)

    def name(self, peer_id: str) -> str:
        record = self.records.get(peer_id)
        return record.name if record else peer_id[-6:]

    # -- one request, with its deadline ------------------------------------------------------

    async def run(self, hop: LiveHop, hidden: torch.Tensor, position: int) -> torch.Tensor:
        """hidden (batch, tokens, H) through `hop` at `position`, within the step deadline."""
        hop.conn.timeout = self.hop_deadline(hop, hidden)
        return await hop.conn.step(hop.session_id, position, hidden)

    async def send(self, hop: LiveHop, hidden: torch.Tensor, position: int, chain: list[LiveHop]) -> float:
        """Sends a step to `hop`, which pushes its output along `chain` (peer/push.py). Returns
        how long each pushing peer waits for the next one's ack (0 without a chain)."""
        next_hops = tuple(NextHop(h.hop.peer_id, h.session_id) for h in chain)
        pushers = [hop, *chain[:-1]]
        ack_ms = min(MAX_ACK_MS, max(1, round(1000 * max(self.push_ack_s(h, hidden) for h in pushers))))
        ack_ms = ack_ms if chain else 0
        await hop.conn.send(Step(hop.session_id, position, hidden, next_hops, ack_ms))
        return ack_ms / 1000

    async def result(self, hop: LiveHop, hidden: torch.Tensor, push_ack_s: float) -> tuple[torch.Tensor, str]:
        """`hop`'s output for input `hidden`, and why its push failed (""). The deadline runs from
        when the previous hop's output came; a hop that pushes (`push_ack_s` > 0, what `send`
        returned) answers after its push was acked or that wait ran out."""
        hop.conn.timeout = self.hop_deadline(hop, hidden) + push_ack_s
        return await hop.conn.step_result(hop.session_id, hidden)

    def hop_deadline(self, hop: LiveHop, hidden: torch.Tensor) -> float:
        payload = 2 * hidden.numel() * hidden.element_size()  # in and out
        return self.deadline(hop.hop.peer_id, hop.end - hop.start, hidden.shape[0], hidden.shape[1], payload)

    def push_ack_s(self, hop: LiveHop, hidden: torch.Tensor) -> float:
        """How long a pushing peer waits for the next one's ack: the policy's floor, plus the
        step's bytes at a slow link and two round trips as the client measured this peer (a
        peer behind a relay or across the internet is that far from others too). A hop's first
        push may have to dial the next peer and read its record first: that wait is longer."""
        rtt_s = self.swarm.rtt_ms.get(hop.hop.peer_id, (0.0, 0.0))[0] / 1000
        payload = hidden.numel() * hidden.element_size()
        first_s = 0.0 if hop.pushed else self.policy.push_first_extra_s
        return self.policy.push_ack_timeout_s + first_s + transfer_s(payload, self.policy) + 2 * rtt_s

    def deadline(self, peer_id: str, blocks: int, batch: int, tokens: int, payload_bytes: int = 0) -> float:
        record = self.records.get(peer_id)
        rtt = self.swarm.rtt_ms.get(peer_id, (0.0, 0.0))[0]
        speed = PeerSpeed(
            decode_ms_per_block=record.decode_ms_per_block if record else 0.0,
            throughput=record.throughput if record else 0.0,
            open_sessions=record.open_sessions if record else 0,
            rtt_ms=rtt,
        )
        return step_deadline_s(speed, blocks, batch, tokens, self.policy, self.budget.used, payload_bytes)

    # -- failures ----------------------------------------------------------------------------

    def failed(
        self, peer_id: str | None, start: int, end: int, error: str, code: ErrorCode | None = None
    ) -> None:
        """Bans the peer (if any) and spends one attempt; raises FailoverError when the budget is
        gone. A peer that refused with back-pressure (`code` BUSY or REMOTE_LIMIT: it is full) is
        only routed around for a while: no ban, no failure counted against it."""
        name = self.name(peer_id) if peer_id else "(none)"
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

    # -- the repair ----------------------------------------------------------------------------

    async def replace(
        self,
        start: int,
        end: int,
        inputs: torch.Tensor | None,
        upstream: str = "",
        formats: dict[int, str] | None = None,
    ) -> tuple[list[LiveHop], dict[int, torch.Tensor], torch.Tensor | None]:
        """New hops for blocks [start, end), with `inputs` replayed through them; the first
        takes pushes from `upstream` (the peer of the hop before `start`), each other one from
        the hop before it. With `formats` (block -> weight format), each block goes to a peer
        of the format that served it before: the recovered output is what the old chain's was.

        Returns the hops, the replay's input at each new hop's start (what its boundary has
        seen), and the output at `end` (None when there was nothing to replay).
        """
        for attempt in itertools.count():  # until it works or the budget raises FailoverError
            await asyncio.sleep(backoff_delay(attempt, self.policy, self.rng))
            hops: list[LiveHop] = []
            try:
                route = await self._route(start, end, formats)
                hops = await self.open_hops(route, upstream)
                seen, output = await self._push(hops, inputs)
                return hops, seen, output
            except NoRouteError as e:
                self.failed(None, start, end, f"no route: {e}")
                if self.no_route_deadline is not None and time.monotonic() >= self.no_route_deadline:
                    raise NoChainError(self.spec.model_id, e) from None
                await self._wait_for_peers(start, end)
            except PeerError as e:
                for hop in hops:
                    hop.conn.close()
                span = next(((h.start, h.end) for h in hops if h.hop.peer_id == e.peer_id), (start, end))
                self.failed(e.peer_id, *span, _short(e), e.code)
            except BaseException:  # cancelled mid-replay: the new hops are nobody's yet
                for hop in hops:
                    hop.conn.close()
                raise
        raise AssertionError("unreachable")

    async def _route(self, start: int, end: int, formats: dict[int, str] | None) -> Route:
        # Off the loop: measuring new peers' round trips and the router's own work may take a while.
        return await asyncio.to_thread(self._choose, start, end, formats)

    def _choose(self, start: int, end: int, formats: dict[int, str] | None = None) -> Route:
        """A chain without banned peers; failing that, one that avoids only the peers that
        failed in this call (a ban from an earlier call is a preference, not a wall)."""
        banned = self.bans.banned()
        try:
            return self._choose_without(banned, start, end, formats)
        except NoRouteError:
            if banned <= self.failed_here:
                raise
            logger.info(
                "no chain for [%d:%d) without banned peers; trying those banned before this call", start, end
            )
            return self._choose_without(banned & self.failed_here, start, end, formats)

    def _choose_without(
        self, exclude: frozenset[str], start: int, end: int, formats: dict[int, str] | None
    ) -> Route:
        records = [r for r in self.records.values() if same_format(r, start, end, formats)]
        return self._route_through(records, exclude, start, end)

    def route_among(self, records: list[PeerRecord]) -> Route:
        """A chain over every block through `records` only (one phase's peers of a disaggregated
        request), without banned peers; NoRouteError if they cannot form one."""
        return self._route_through(records, self.bans.banned(), 0, self.spec.num_blocks)

    def _route_through(
        self, records: list[PeerRecord], exclude: frozenset[str], start: int, end: int
    ) -> Route:
        """The router's chain over blocks [start, end) among `records`, leaving `exclude` out
        (they are not pinged either)."""
        allowed = [r for r in records if r.peer_id not in exclude]
        view = self.swarm.view(allowed, self.spec.num_blocks, self.spec.hidden_size, self.ping_timeout)
        return route_span(self.router, view, self.request, start, end, exclude)

    async def _wait_for_peers(self, start: int, end: int) -> None:
        """Polls the DHT until peers other than this call's failed ones cover [start, end),
        for at most the time budget left: a peer restarting or joining counts one attempt."""
        while True:
            await asyncio.to_thread(self.refresh_records)
            served = {
                b
                for r in self.records.values()
                if r.peer_id not in self.failed_here
                for b in range(r.start, r.end)
            }
            out_of_time = self.budget.seconds_left() <= WAIT_POLL_S or (
                self.no_route_deadline is not None and time.monotonic() >= self.no_route_deadline
            )
            if served >= set(range(start, end)) or out_of_time:
                return
            await asyncio.sleep(WAIT_POLL_S)

    def refresh_records(self) -> None:
        """Re-reads the records from the DHT (peers may have joined since the session opened)."""
        fresh = self.swarm.online_records(self.spec.model_id, self.spec.num_blocks)
        self.records = {r.peer_id: r for r in fresh if r.max_length >= self.request.prompt_tokens}

    async def open_hops(
        self,
        route: Route,
        upstream: str,
        kv_from: list[tuple[str, ...]] | None = None,
        kv_to: list[tuple[KvTarget, ...]] | None = None,
        prompt_length: int = 0,
    ) -> list[LiveHop]:
        """Opens a session on each hop of `route`; with `kv_from` / `kv_to` (one entry per hop),
        decode sessions that take a prompt's keys and values (of `prompt_length` tokens), or
        prefill sessions that send them."""
        opened: list[LiveHop] = []
        try:
            for index, hop in enumerate(route.hops):
                upstream = opened[-1].hop.peer_id if opened else upstream
                timeout = self.deadline(hop.peer_id, 0, 1, 1)
                conn = await self.swarm.open_connection(hop.peer_id, self.name(hop.peer_id), timeout=timeout)
                conn.timeout = timeout
                record = self.records.get(hop.peer_id)
                quant = record.quant if record else DEFAULT_QUANT
                live = LiveHop(hop, conn, random_session_id(), upstream, quant)
                opened.append(live)
                await conn.open(
                    live.session_id,
                    self.spec.model_id,
                    hop.start,
                    hop.end,
                    self.request.prompt_tokens,
                    self.request.batch_size,
                    self.dtype,
                    upstream,
                    kv_from=kv_from[index] if kv_from else (),
                    kv_to=kv_to[index] if kv_to else (),
                    prompt_length=prompt_length if kv_from else 0,
                )
        except BaseException:
            for live in opened:
                live.conn.close()
            raise
        return opened

    async def _push(
        self, hops: list[LiveHop], inputs: torch.Tensor | None
    ) -> tuple[dict[int, torch.Tensor], torch.Tensor | None]:
        """Replays `inputs` (batch, tokens, H) through `hops` in chunks; returns what each start saw and the output."""
        seen: dict[int, torch.Tensor] = {}
        hidden = inputs
        for hop in hops:
            if hidden is None:
                break
            seen[hop.start] = hidden
            hidden = await self._replay(hop, hidden)
        return seen, hidden

    async def _replay(self, hop: LiveHop, hidden: torch.Tensor) -> torch.Tensor:
        per_token = hidden.shape[0] * hidden.shape[2] * hidden.element_size()
        chunk = max(1, REPLAY_CHUNK_BYTES // per_token)
        outputs = []
        for position in range(0, hidden.shape[1], chunk):
            outputs.append(await self.run(hop, hidden[:, position : position + chunk].contiguous(), position))
        return torch.cat(outputs, dim=1)

    def new_failover(self, peer_id: str | None, start: int, end: int, error: PeerError) -> Failover:
        return Failover(self.name(peer_id) if peer_id else "?", start, end, _short(error), time.monotonic())


def same_format(record: PeerRecord, start: int, end: int, formats: dict[int, str] | None) -> bool:
    """Whether `record` stores every block it would serve of [start, end) in the format that
    block had before (`formats`; None: any format the client accepts)."""
    if formats is None:
        return True
    overlap = range(max(record.start, start), min(record.end, end))
    return all(formats.get(block, record.quant) == record.quant for block in overlap)


def _short(error: PeerError) -> str:
    what = error.code.name if error.code is not None else "UNREACHABLE"
    return f"{what}: {error.message[:200]}"
