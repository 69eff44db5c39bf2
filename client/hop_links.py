"""Opening, running and closing the hops of a session: the part that talks to peers.

A hop is blocks [start, end) in a session on one peer (`LiveHop`). `HopLinks` dials each hop's
peer, opens the session there (for push, naming the peer whose pushed steps it takes; for a
disaggregated request, where its keys and values come from or go to), sends steps and reads
their results, and closes the sessions or just drops their streams.

Every request carries a deadline from the peer's announced speed (client.deadline), so a
stalled peer costs about a second, not a fixed minute. A hop that pushes its output on to the
next peer (peer/push.py) answers at once and sends whether the push was taken after its answer
(`push_failure` reads it while the next hop's answer is awaited); a peer of before answers only
once that push was acked or its wait ran out, so its deadline grows by that wait.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import torch

from hexswarm.client.deadline import PeerSpeed, step_deadline_s, transfer_s
from hexswarm.client.known_peers import KnownPeers
from hexswarm.client.remote import PeerConnection, PeerError, close_sessions, random_session_id
from hexswarm.client.retry import RetryBudget, RetryPolicy
from hexswarm.client.swarm_client import SwarmClient
from hexswarm.routing.chains.swarm_view import Hop, Route, RouteRequest
from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT
from hexswarm.swarm.models.model_spec import ModelSpec
from hexswarm.swarm.wire.protocol import MAX_ACK_MS, KvTarget, NextHop, Step


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

    @property
    def peer_id(self) -> str:
        return self.hop.peer_id


@dataclass(frozen=True)
class HopOutput:
    """What one hop answered for a step."""

    hidden: torch.Tensor  # (batch, tokens, H): its output, the next hop's input
    push_error: str  # why its push to the next hop failed ("" = it did, or it pushed nothing)
    pending: bool = False  # it answered before its push's outcome, which its stream sends next


@dataclass
class HopLinks:
    """Opens, runs and closes the hops of one session (all on the client loop)."""

    swarm: SwarmClient
    spec: ModelSpec
    request: RouteRequest
    dtype: torch.dtype
    policy: RetryPolicy
    peers: KnownPeers
    budget: RetryBudget  # the session's: each attempt spent lengthens the deadlines (client.deadline)

    async def open(
        self,
        route: Route,
        upstream: str,
        kv_from: list[tuple[str, ...]] | None = None,
        kv_to: list[tuple[KvTarget, ...]] | None = None,
        prompt_length: int = 0,
        pipelined: bool = False,
    ) -> list[LiveHop]:
        """Opens a session on each hop of `route`, the first taking pushes from `upstream`; with
        `kv_from` / `kv_to` (one entry per hop), decode sessions that take a prompt's keys and
        values (of `prompt_length` tokens), or prefill sessions that send them. The hops open
        all at once (each names the peer before it in the route, known already), so a chain of
        any length costs one round trip before its first step, not one per hop; `pipelined`,
        none: the OPENs are sent and the first step follows them (a refused OPEN fails that
        step's hop, which fails over like any). On any error, every stream opened is dropped
        and the first hop's error (in route order) raised."""
        upstreams = [upstream, *(hop.peer_id for hop in route.hops[:-1])]
        outcomes = await asyncio.gather(
            *(
                self._open_hop(index, hop, upstreams[index], kv_from, kv_to, prompt_length, pipelined)
                for index, hop in enumerate(route.hops)
            ),
            return_exceptions=True,
        )
        opened = [o for o in outcomes if isinstance(o, LiveHop)]
        failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failed is not None:
            self.drop(opened)
            raise failed
        return opened

    async def _open_hop(
        self, index: int, hop: Hop, upstream: str, kv_from, kv_to, prompt_length: int, pipelined: bool
    ) -> LiveHop:
        live = await self._dial(hop, upstream)
        try:
            await live.conn.open(
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
                wait=not pipelined,
            )
        except BaseException:
            live.conn.close()
            raise
        return live

    async def _dial(self, hop: Hop, upstream: str) -> LiveHop:
        timeout = self.deadline(hop.peer_id, 0, 1, 1)
        conn = await self.swarm.open_connection(hop.peer_id, self.peers.name(hop.peer_id), timeout=timeout)
        conn.timeout = timeout
        record = self.peers.get(hop.peer_id)
        quant = record.quant if record else DEFAULT_QUANT
        return LiveHop(hop, conn, random_session_id(), upstream, quant)

    @staticmethod
    def drop(hops: list[LiveHop]) -> None:
        """Ends the hops' streams without closing their sessions (their peers free them)."""
        for hop in hops:
            hop.conn.close()

    @staticmethod
    async def close(hops: list[LiveHop]) -> None:
        """Closes the hops' sessions, freeing their caches now."""
        await close_sessions([(hop.conn, hop.session_id) for hop in hops])

    # -- one request, with its deadline ------------------------------------------------------

    async def run(self, hop: LiveHop, hidden: torch.Tensor, position: int) -> torch.Tensor:
        """hidden (batch, tokens, H) through `hop` at `position`, within the step deadline."""
        hop.conn.timeout = self.hop_deadline(hop, hidden)
        return await hop.conn.step(hop.session_id, position, hidden)

    async def send(self, hop: LiveHop, hidden: torch.Tensor, position: int, chain: list[LiveHop]) -> float:
        """Sends a step to `hop`, which pushes its output along `chain` (peer/push.py). Returns
        how long each pushing peer waits for the next one's ack (0 without a chain)."""
        next_hops = tuple(NextHop(h.peer_id, h.session_id) for h in chain)
        pushers = [hop, *chain[:-1]]
        ack_ms = min(MAX_ACK_MS, max(1, round(1000 * max(self.push_ack_s(h, hidden) for h in pushers))))
        ack_ms = ack_ms if chain else 0
        # early: each pushing peer answers before its push is acked (peer/push.py), a crossing less
        await hop.conn.send(Step(hop.session_id, position, hidden, next_hops, ack_ms, early=bool(chain)))
        return ack_ms / 1000

    async def result(self, hop: LiveHop, hidden: torch.Tensor, position: int, push_ack_s: float) -> HopOutput:
        """`hop`'s output for input `hidden`, and why its push failed (or that its outcome comes
        next: `pending`). The deadline runs from when the previous hop's output came; a hop that
        pushes (`push_ack_s` > 0, what `send` returned) and answers only once its push was acked
        (a peer of before) may wait that long more."""
        hop.conn.timeout = self.hop_deadline(hop, hidden) + push_ack_s
        result = await hop.conn.step_result(hop.session_id, hidden, position)
        if result.push_pending:
            hop.conn.expect_outcome(hop.session_id, hop.conn.timeout)
        return HopOutput(result.hidden, result.push_error, result.push_pending)

    @staticmethod
    async def push_failure(pusher: LiveHop, receiver: LiveHop) -> str:
        """After `pusher` answered early: why its push to `receiver` failed, as soon as its
        outcome says so, or "" once `receiver`'s answer has begun to come (the push reached it)
        or the outcome says it was taken. The outcome's read has the pusher's deadline."""
        outcome = pusher.conn.outcome
        if outcome is None:
            return ""
        arrival = asyncio.ensure_future(receiver.conn.answer_begun())
        try:
            await asyncio.wait({outcome, arrival}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            arrival.cancel()  # not the read it waits for: that one is the answer's
        answered = arrival.done() and not arrival.cancelled()  # the push got there
        if answered or not outcome.done() or outcome.cancelled():
            return ""
        try:
            return outcome.result()
        except PeerError as e:  # the pusher went quiet after its answer: whether it pushed is unknown
            return f"no push outcome from {pusher.conn.peer_name}: {e.message}"

    def hop_deadline(self, hop: LiveHop, hidden: torch.Tensor) -> float:
        payload = 2 * hidden.numel() * hidden.element_size()  # in and out
        return self.deadline(hop.peer_id, hop.end - hop.start, hidden.shape[0], hidden.shape[1], payload)

    def push_ack_s(self, hop: LiveHop, hidden: torch.Tensor) -> float:
        """How long a pushing peer waits for the next one's ack: the policy's floor, plus the
        step's bytes at a slow link and two round trips as the client measured this peer (a
        peer behind a relay or across the internet is that far from others too). A hop's first
        push may have to dial the next peer and read its record first: that wait is longer."""
        rtt_s = self.swarm.rtt_ms.get(hop.peer_id, (0.0, 0.0))[0] / 1000
        payload = hidden.numel() * hidden.element_size()
        first_s = 0.0 if hop.pushed else self.policy.push_first_extra_s
        return self.policy.push_ack_timeout_s + first_s + transfer_s(payload, self.policy) + 2 * rtt_s

    def deadline(self, peer_id: str, blocks: int, batch: int, tokens: int, payload_bytes: int = 0) -> float:
        """Seconds `peer_id` gets for `blocks` blocks of a (batch, tokens) step (client.deadline)."""
        record = self.peers.get(peer_id)
        rtt = self.swarm.rtt_ms.get(peer_id, (0.0, 0.0))[0]
        speed = PeerSpeed(
            decode_ms_per_block=record.decode_ms_per_block if record else 0.0,
            throughput=record.throughput if record else 0.0,
            open_sessions=record.open_sessions if record else 0,
            rtt_ms=rtt,
        )
        return step_deadline_s(speed, blocks, batch, tokens, self.policy, self.budget.used, payload_bytes)
