"""An inference session: one sequence batch's path through the swarm, repaired when peers fail.

Opening picks a route (ordered hops covering every block) with the client's router and opens
a remote session on each hop's peer; each step sends the new tokens' hidden states through
the hops in order and returns the last hop's output. Each peer keeps the session's KV cache
for its blocks until the session closes.

With `push`, the client sends a step to the first hop only, and each peer
pushes its output straight to the next (peer/push.py); every hop still sends its output to
the client, which reads them in order: they are the next hop's input, which the history below
keeps. When a push fails, that hop reports it with its output and the client sends the step
to the next hop itself (relay), and does so for a few steps before a push tries again
(client.push_relay). A hop whose session was opened next to another peer (the one after a repaired span) is relayed too. With
`push=False`, every hop is relayed: the client sends the step to each hop itself. Each hop's
result commits to the input it computed on (swarm/wire/commitments.py), so a pushed hop that got
something other than what the previous hop sent the client fails over like a failed hop; the
client's copies are what verification (client/verify.py) checks, pushed or not.

Exact failover: the session keeps what each hop has been sent (client.history). When a hop's
peer dies, stalls past its deadline, refuses or answers garbage, the session bans it,
routes that hop's blocks again and replays the kept inputs plus the current step to the new
hops (client.span_repair), then goes on with the step from there. The new peers' KV caches then
hold what the old one held, so greedy output equals a run without failures.

The session wires the failover parts (client/failover.py lists them) and runs steps through
them; which hops take pushes is client.push_relay's, and a check of each hop's output (the
verifier) plugs in through client.hop_check's hooks.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass

import torch

from hexswarm.client.chain_choice import ChainChooser
from hexswarm.client.disaggregation import Roles, kv_sources, kv_targets, split_by_role
from hexswarm.client.history import InputHistory
from hexswarm.client.hop_check import CheckedSession, HopCheck
from hexswarm.client.hop_links import HopLinks, HopOutput, LiveHop
from hexswarm.client.known_peers import KnownPeers
from hexswarm.client.peer_failures import Failover, PeerFailures
from hexswarm.client.push_relay import HopClock, PushPlan
from hexswarm.client.remote import CLOSE_TIMEOUT_S, CommitmentMismatch, KvTransferError, PeerError
from hexswarm.client.retry import BanList, RetryPolicy, rate_limit_wait
from hexswarm.client.span_repair import SpanRepair
from hexswarm.client.swarm_client import SwarmClient, uncovered_blocks
from hexswarm.client.verify_records import RollbackNeeded, VerificationError
from hexswarm.client.worker import run_sync
from hexswarm.routing.chains.swarm_view import NoRouteError, Router, RouteRequest
from hexswarm.swarm.models.model_spec import ModelSpec
from hexswarm.swarm.trust.records import block_ranges

logger = logging.getLogger(__name__)


class InferenceSession:
    """Remote sessions along one route; `step` is synchronous (it runs on the client loop)."""

    def __init__(
        self,
        swarm: SwarmClient,
        router: Router,
        spec: ModelSpec,
        *,
        max_length: int,
        batch_size: int,
        dtype: torch.dtype,
        coverage_timeout: float,
        policy: RetryPolicy | None = None,
        bans: BanList | None = None,
        push: bool = True,
    ):
        self.swarm, self.spec = swarm, spec
        self.max_length, self.batch_size, self.dtype = max_length, batch_size, dtype
        self.coverage_timeout = coverage_timeout
        self.policy = policy or RetryPolicy()
        self.session_id = secrets.token_hex(8)
        self.hops: list[LiveHop] = []
        self.position = 0  # tokens of each sequence the swarm has cached
        self.failovers: list[Failover] = []
        # checks each hop's output (client/hop_check.py): a client/verify.py Verifier for verify > 0
        self.verifier: HopCheck | None = None
        # Set by the caller when nobody wants the answer any more (the API's client left): a
        # step or an open waiting on peers, a failover included, stops within 0.1 s.
        self.cancel: threading.Event | None = None
        self.pushes = PushPlan(push)
        self.swarm_s = 0.0  # wall seconds `step` waited on the chain (the rest is the caller's own work)
        # A disaggregated session (client/disaggregation.py): its decode chain, opened and
        # waiting for the prompt's keys and values while `hops` is the prefill chain; None after.
        self.decode_hops: list[LiveHop] | None = None
        self.prefill_route = ""  # the chain the prompt went through, when it was disaggregated
        request = RouteRequest(prompt_tokens=max_length, new_tokens=0, batch_size=batch_size)
        self.known = KnownPeers(swarm, spec, max_length)
        self.failures = PeerFailures(swarm, self.known, self.policy, bans or BanList(self.policy))
        self.chooser = ChainChooser(swarm, router, spec, request, self.known, self.failures, pushed=push)
        self.links = HopLinks(swarm, spec, request, dtype, self.policy, self.known, self.failures.budget)
        self.repair = SpanRepair(self.chooser, self.links, self.failures)
        dtype_bytes = torch.tensor([], dtype=dtype).element_size()
        self.history = InputHistory(
            batch_size * max_length * spec.hidden_size * dtype_bytes, self.policy.max_history_bytes
        )

    @property
    def retries_used(self) -> int:
        return self.failures.budget.used

    @property
    def hop_steps(self) -> Counter[str]:
        """Hop steps the client sent / that peers pushed; pushes that failed (then relayed)."""
        return self.pushes.hop_steps

    def checked(self) -> CheckedSession:
        """What a HopCheck (client/verify.py's Verifier) may read of this session."""
        return CheckedSession(
            self.swarm, self.spec, self.max_length, self.batch_size, self.dtype, self.history, self.known.name
        )

    def open(self, prompt_tokens: int = 0) -> InferenceSession:
        """Opens the route; `prompt_tokens`, the first step's tokens, is what a disaggregated
        decode chain is told its pushed keys and values must hold (0: not said)."""
        records = self.swarm.wait_for_coverage(
            self.spec.model_id, self.spec.num_blocks, self.coverage_timeout
        )
        long_enough = peers_for_length(self.max_length, records, self.spec.num_blocks)
        self.known.set(long_enough)
        self.chooser.no_route_deadline = time.monotonic() + self.coverage_timeout
        try:
            roles = split_by_role(long_enough, self.spec.num_blocks)
            if roles is not None:
                run_sync(self._open_disaggregated(roles, prompt_tokens), self._timeout(), self.cancel)
            if not self.hops:
                opened = self.repair.replace(0, self.spec.num_blocks, None)
                self.hops = run_sync(opened, self._timeout(), self.cancel).hops
        finally:
            self.chooser.no_route_deadline = None  # later failovers have the retry budget
        self.chooser.ping_timeout = self.policy.deadline_floor_s  # later pings are on the failover path
        # a disaggregated session keeps only the embeddings: its two chains share no other boundary
        self.history.keep([0] if self.decode_hops is not None else [h.start for h in self.hops])
        logger.info("session %s: route %s", self.session_id, self.describe_route())
        return self

    def _timeout(self) -> float:
        # A safety net only: every request inside has its own deadline and the budget bounds retries.
        return self.policy.retry_budget_s + 120

    def step(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (batch, new_tokens, hidden_size) -> the same shape, after every block."""
        if self.position + hidden.shape[1] > self.max_length:
            raise ValueError(
                f"session max_length {self.max_length} reached ({self.position} + {hidden.shape[1]})"
            )
        hidden = hidden.to(self.dtype).contiguous()
        step = self._prefill(hidden) if self.decode_hops is not None else self._step(hidden)
        began = time.perf_counter()
        output = run_sync(step, self._timeout(), self.cancel)
        self.swarm_s += time.perf_counter() - began
        self.position += hidden.shape[1]
        return output

    def roll_back(self, position: int) -> None:
        """The next step starts at `position`, below what the swarm has cached: the tokens after
        it were drafted and rejected (docs/speculation.md). Every peer drops them when that step
        reaches it (the step carries its position); the kept inputs and the verifier forget them
        now, so a replay or a check never feeds them again."""
        if not 0 <= position <= self.position:
            raise ValueError(f"cannot roll back to token {position}: the swarm has {self.position} cached")
        self.history.drop_last(self.position - position)
        if self.verifier is not None:
            self.verifier.rolled_back(position)
        self.position = position

    async def _open_disaggregated(self, roles: Roles, prompt_tokens: int = 0) -> None:
        """Opens the decode chain (its sessions take keys and values from the prefill peers),
        then the prefill chain (its sessions send theirs); on any failure, nothing stays open
        and the caller opens a colocated chain."""
        decode_hops: list[LiveHop] = []
        try:
            prefill = await asyncio.to_thread(self.chooser.route_among, roles.prefill)
            decode = await asyncio.to_thread(self.chooser.route_among, roles.decode)  # no peer is in both
            sources = [kv_sources(h.start, h.end, prefill) for h in decode.hops]
            decode_hops = await self.links.open(decode, "", kv_from=sources, prompt_length=prompt_tokens)
            targets = [kv_targets(h.start, h.end, decode_hops) for h in prefill.hops]
            self.hops = await self.links.open(prefill, "", kv_to=targets)
            self.decode_hops = decode_hops
        except (NoRouteError, PeerError) as e:
            logger.info("session %s: no disaggregated chains (%s); serving colocated", self.session_id, e)
            await self.links.close(decode_hops)
            self.hops, self.decode_hops = [], None
        except BaseException:  # cancelled: the decode sessions are nobody's yet, end their streams
            self.links.drop(decode_hops)
            raise

    async def _prefill(self, hidden: torch.Tensor) -> torch.Tensor:
        """The prompt through the prefill chain, whose peers hand its keys and values to the
        decode chain before they answer; then the decode chain serves every later step. If any
        of it fails, the request is served colocated: a fresh chain replays the prompt."""
        inputs: dict[int, torch.Tensor] = {}
        try:
            reached = _Reached(hidden, 0)
            while reached.next_hop < len(self.hops):
                reached = await self._segment(reached.next_hop, reached.hidden, inputs)
        except (_HopFailed, KvTransferError) as e:
            return await self._prefill_colocated(hidden, e)
        self.prefill_route = self.describe_route()
        prefill_hops, self.hops, self.decode_hops = self.hops, self.decode_hops, None
        await self.links.close(prefill_hops)
        self.history.append({0: hidden})
        logger.info("session %s: prompt prefilled; decoding on %s", self.session_id, self.describe_route())
        return reached.hidden

    async def _prefill_colocated(self, hidden: torch.Tensor, error: Exception) -> torch.Tensor:
        if isinstance(error, _HopFailed):  # a prefill peer failed: banned like any failed hop
            bad = self.hops[error.index]
            self.failures.failed(bad.peer_id, bad.start, bad.end, str(error.error)[:200])
        logger.info(
            "session %s: disaggregated prefill failed (%s); serving colocated", self.session_id, error
        )
        await self.links.close([*self.hops, *(self.decode_hops or [])])
        self.hops, self.decode_hops = [], None
        colocated = await self.repair.replace(0, self.spec.num_blocks, hidden)
        self.hops = colocated.hops
        self.history.keep([h.start for h in self.hops])
        self.history.append(colocated.seen)
        return colocated.output

    async def _step(self, hidden: torch.Tensor) -> torch.Tensor:
        inputs: dict[int, torch.Tensor] = {}  # block boundary -> this step's input there
        self.pushes.next_step()
        i, paced_s = 0, 0.0
        while i < len(self.hops):
            try:
                reached = await self._segment(i, hidden, inputs)
            except _HopFailed as e:
                if isinstance(e.error, VerificationError) and e.error.position < self.position:
                    # an earlier step was wrong: every hop after the liar built on it
                    raise RollbackNeeded(e.error) from None
                wait = rate_limit_wait(e.error)
                if wait is not None and paced_s + wait <= self.policy.rate_limit_wait_s:
                    # The peer refused before computing anything: the same input again, later.
                    if not paced_s:
                        logger.info(
                            "session %s: %s asks it to slow down (%s)",
                            self.session_id, e.error.peer, e.error.message,
                        )  # fmt: skip
                    paced_s += wait
                    await asyncio.sleep(wait)
                    i = e.index
                    hidden = inputs[self.hops[i].start]
                    continue
                reached = await self._recover(e.index, e.error, inputs)
            hidden, i = reached.hidden, reached.next_hop
        self.history.append(inputs)
        return hidden

    async def _segment(self, i: int, hidden: torch.Tensor, inputs: dict) -> _Reached:
        """Sends the step to hop i, which pushes it on to the hops up to the segment's end
        (client.push_relay); reads each hop's output in order. Returns the last output read and
        the next hop to send to."""
        end = self.pushes.segment_end(self.hops, i)
        inputs[self.hops[i].start] = hidden
        sent = time.perf_counter()
        try:
            push_ack_s = await self.links.send(self.hops[i], hidden, self.position, self.hops[i + 1 : end])
        except PeerError as e:
            raise _HopFailed(i, e) from None
        clock = HopClock(self.swarm, sent, decode=tuple(hidden.shape[:2]) == (1, 1))
        self.pushes.sent(i, end)  # corrected below if a push fails
        outcome_due = False  # the hop before answered ahead of its push's outcome
        for j in range(i, end):
            hop = self.hops[j]
            inputs[hop.start] = hidden
            if outcome_due:
                why = await self.links.push_failure(self.hops[j - 1], hop)
                if why:
                    return self._relay_from(j, end, why, hidden)
                self._pushed(j - 1)
            try:
                answer = await self._answer(j, i, end, hidden, push_ack_s, clock)
            except PeerError as e:
                raise _HopFailed(j, e) from None
            hidden, outcome_due = answer.hidden, answer.pending
            if j + 1 < end and answer.push_error:
                return self._relay_from(j + 1, end, answer.push_error, hidden)
            if j + 1 < end and not answer.pending:
                self._pushed(j)
        return _Reached(hidden, end)

    def _pushed(self, j: int) -> None:
        self.hops[j].pushed = True
        self.pushes.pushed_into(self.hops[j + 1])

    def _relay_from(self, j: int, end: int, why: str, hidden: torch.Tensor) -> _Reached:
        """Hop j never got the step pushed (`why`): the client feeds it, and does for a while."""
        steps = self.pushes.push_failed(self.hops, j - 1, end)
        logger.info("session %s: %s; relaying that hop for %d steps", self.session_id, why, steps)
        return _Reached(hidden, j)

    async def _answer(
        self, j: int, first: int, end: int, hidden: torch.Tensor, push_ack_s: float, clock: HopClock
    ) -> HopOutput:
        """Hop j's output for `hidden` in the segment [first, end), timed, then checked by the
        verifier; a VerificationError fails this hop over like any other PeerError."""
        hop = self.hops[j]
        try:
            answer = await self.links.result(hop, hidden, self.position, push_ack_s if j + 1 < end else 0)
        except CommitmentMismatch:
            if j > first:  # it was pushed: the pusher's link is not trusted any more
                self.pushes.distrust(self.hops[j - 1].peer_id)
            raise
        clock.answered(hop, first=j == first)
        if self.verifier is not None:
            checking = time.perf_counter()
            await self.verifier.after_hop(hop, self.position, hidden, answer.hidden)
            clock.worked_since(checking)
        return answer

    async def _recover(self, failed: int, error: PeerError, inputs: dict[int, torch.Tensor]) -> _Reached:
        """Replaces hop `failed` (and the hops after the nearest kept boundary before it) and
        runs this step through the new hops; returns their output and the next hop's index."""
        bad = self.hops[failed]
        bad.conn.close()
        event = self.failures.new_failover(bad.peer_id, bad.start, bad.end, error)
        if not isinstance(error, CommitmentMismatch):  # its input came from a peer that equivocated
            self.failures.failed(bad.peer_id, bad.start, bad.end, event.error, error.code)
        start = self.history.replay_start(bad.start)
        first = next(j for j, h in enumerate(self.hops) if h.start == start)
        past = self.history.inputs(start)
        replay = inputs[start] if past is None else torch.cat([past, inputs[start]], dim=1)
        upstream = self.hops[first - 1].peer_id if first > 0 else ""
        formats = self.formats(self.hops[first : failed + 1])
        new = await self.repair.replace(start, bad.end, replay, upstream, formats)
        self.links.drop(self.hops[first:failed])
        self.hops[first : failed + 1] = new.hops
        self.history.keep([h.start for h in self.hops])
        for boundary, full in new.seen.items():  # what each new boundary saw: past tokens, then this step's
            self.history.replace(boundary, full[:, : self.position])
            inputs[boundary] = full[:, self.position :]
        event.recovered, event.attempts = time.monotonic(), self.retries_used
        self.failovers.append(event)
        logger.info(
            "session %s: %s failed (%s); blocks [%d:%d) now on %s",
            self.session_id, event.peer, event.error, start, bad.end, self.describe_route(),
        )  # fmt: skip
        return _Reached(new.output[:, self.position :], first + len(new.hops))

    def finish_verification(self) -> None:
        """Has the verifier check every step it has not checked yet (a generation is about to
        return); raises RollbackNeeded if one of them was a lie."""
        if self.verifier is None:
            return
        try:
            run_sync(self.verifier.finish(), self._timeout(), self.cancel)
        except VerificationError as e:
            raise RollbackNeeded(e) from None

    def formats(self, hops: list[LiveHop]) -> dict[int, str]:
        """Block -> the weight format of the peer that served it on `hops` (what a replay keeps)."""
        return {block: hop.quant for hop in hops for block in range(hop.start, hop.end)}

    def close(self) -> None:
        if self.verifier is not None:
            self.verifier.close()
        self.chooser.release()
        hops, self.hops = [*self.hops, *(self.decode_hops or [])], []
        if hops:
            run_sync(self.links.close(hops), timeout=2 * CLOSE_TIMEOUT_S)

    def peer_names(self) -> list[str]:
        """Names of the peers of the current chain, in order."""
        return [self.known.name(h.peer_id) for h in self.hops]

    def describe_route(self) -> str:
        """'a[0:2) -> b[2:8)'; a disaggregated session's is its prompt's chain, then '=>' and its
        decode chain: 'p[0:8) => d[0:8)'."""
        if not self.hops:
            return "(no route)"
        chain = " -> ".join(f"{self.known.name(h.peer_id)}[{h.start}:{h.end})" for h in self.hops)
        return f"{self.prefill_route} => {chain}" if self.prefill_route else chain

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class _Reached:
    """How far a step got along the chain."""

    hidden: torch.Tensor  # (batch, tokens, H): the output of the last hop it went through
    next_hop: int  # the index of the hop it goes to next (len(hops): it is done)


class _HopFailed(Exception):
    """Hop `index` of the chain failed this step."""

    def __init__(self, index: int, error: PeerError):
        super().__init__(str(error))
        self.index, self.error = index, error


class SequenceTooLongError(ValueError):
    """A session asks for more tokens than the peers of some block accept (their --max-length)."""


def peers_for_length(max_length: int, records: list, num_blocks: int) -> list:
    """The peers that accept a sequence of `max_length` tokens; fails at once, naming the limit,
    when they leave blocks uncovered: waiting would not help (the limits are their operators')."""
    long_enough = [r for r in records if r.max_length >= max_length]
    short = uncovered_blocks(long_enough, num_blocks)
    if short:
        limit = longest_sequence(records, num_blocks)
        raise SequenceTooLongError(
            f"a sequence of {max_length} tokens (prompt + new tokens) is longer than this swarm serves: "
            f"the peers of blocks {block_ranges(short)} accept at most {limit} tokens"
        )
    return long_enough


def longest_sequence(records: list, num_blocks: int) -> int:
    """The longest sequence a chain can carry: per block, the best of its peers' --max-length."""
    best = [0] * num_blocks
    for r in records:
        for block in range(max(0, r.start), min(r.end, num_blocks)):
            best[block] = max(best[block], r.max_length)
    return min(best, default=0)
