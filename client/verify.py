"""Output verification: a share of a session's hop steps is recomputed by a second peer.

With `verify=p`, each hop step is checked with probability p. The checking peer (a *witness*:
another online peer that serves the hop's blocks in the same weight format, from another IP
group where there is one) runs a *shadow session* of its own for that hop. The shadow is
caught up by replaying the hop's earlier inputs, which the session keeps anyway for failover
(client/history.py), in one chunk together with the checked step's input. The two outputs are
compared token by token, each relative to its own size, within the tolerance calibrated on
SmolLM2 for the coarsest format involved (swarm/trust/verify_tolerance.py).

Evidence, not accusations. When the server and the witness disagree, one witness's word is not
enough: a third peer (of the same format, preferably from a third IP group) recomputes the
step. The peer that the third one disagrees with, while agreeing with the other, is the liar:
it is banned by this client and on this machine for 30 days (swarm/trust/bans.py), and a signed report
naming the evidence (input hash, both output hashes) is published in the DHT (swarm/trust/reports.py).
Up to three third peers are asked in turn. With no third opinion that settles it, nobody is
blamed: the steps count as "disputed" among those that could not be compared, and the
generation raises UnsettledDisputeError instead of returning its output as checked, unless the
caller accepts unsettled output. A third peer of the servers' or the witness's IP group still
settles (a private swarm on one subnet has no other), and the verdict says it is the weaker
guarantee. If the liar is the serving peer, the
step fails with VerificationError, a PeerError naming that peer, so the session fails over to
another peer (which recomputes the step from the kept inputs) or fails; if it is the witness,
the generation goes on.

The counts are honest (VerifyStats): a step counts as compared only once a witness answered
and the comparison was settled; every sampled step that could not be, counts under its reason.

Cost: one extra step per checked hop step (a longer one when a shadow catches up); no memory
beyond the failover history. A hop whose start boundary that history does not keep whole
(beyond its `max_history_bytes`, or a disaggregated session's decode hops after the first)
cannot be checked and counts as such.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import replace

import torch
from hivemind.utils import get_dht_time

from hexswarm.client.evidence_sync import record_format, share_evidence
from hexswarm.client.group_cap import record_groups
from hexswarm.client.hop_check import CheckedSession
from hexswarm.client.hop_links import LiveHop
from hexswarm.client.remote import (
    CLOSE_TIMEOUT_S,
    PeerError,
    close_sessions,
    random_session_id,
)
from hexswarm.client.verify_evidence import evidence_of_lie, publish_report_signed
from hexswarm.client.verify_records import (
    DISPUTED,
    MAX_RUN_TOKENS,
    NO_WITNESS,
    NOT_KEPT,
    PUSHED_CACHE,
    WITNESS_FAILED,
    Dispute,
    Run,
    Served,
    Shadow,
    SpanTally,
    VerificationError,
    VerifyStats,
)
from hexswarm.client.worker import run_sync
from hexswarm.swarm.trust.bans import add_ban, new_ban
from hexswarm.swarm.trust.records import PeerRecord
from hexswarm.swarm.trust.reports import Report, tensor_hash
from hexswarm.swarm.trust.verify_tolerance import TOLERANCES, Comparison, coarsest, compare
from hexswarm.swarm.wire.tensors import DTYPE_NAMES

logger = logging.getLogger(__name__)

RECORDS_TTL_S = 30.0  # how long the list of candidate witnesses is reused
WITNESS_TIMEOUT_S = 30.0  # opening a shadow session and catching it up (a replay of the span's inputs)
MAX_THIRD_OPINIONS = 3  # third peers asked in turn to settle one disagreement


class Verifier:
    """Verifies one InferenceSession's hop steps in runs; lives as long as the session, plugged
    into it as its HopCheck (client/hop_check.py).

    Every hop step's output is kept (per span) until a witness has checked it. A sampled step
    checks its span's whole run since the last check: the witness's shadow session catches up
    on those tokens in one prefill-shaped pass, and each of the run's steps is compared. So a
    peer that lies on one step in twenty is caught at the first check after the lie, and
    `finish` checks what is left when a generation ends."""

    def __init__(
        self,
        session: CheckedSession,
        share: float,
        stats: VerifyStats | None = None,
        rng: random.Random | None = None,
    ):
        self.session, self.swarm, self.spec = session, session.swarm, session.spec
        self.share = share
        self.rng = rng or random.Random()
        self.stats = (
            stats or VerifyStats()
        )  # may be shared by a model's sessions (counted on the client loop)
        self.shadows: dict[tuple[str, int, int], Shadow] = {}
        self.witness_of: dict[tuple[int, int], str] = {}  # span -> the peer whose shadow checks it
        self.served: dict[tuple[int, int], list[Served]] = {}
        self.witness_steps: dict[str, Served] = {}  # witness -> its last shadow step (for evidence)
        self.quants: dict[tuple[int, int], str] = {}
        self.tally: dict[tuple[int, int], SpanTally] = {}  # this session's steps and comparisons per span
        self.disputes: list[Dispute] = []  # runs no third peer settled: not checked output
        self._records: tuple[float, list[PeerRecord]] = (-RECORDS_TTL_S, [])

    async def after_hop(
        self, hop: LiveHop, position: int, hidden_in: torch.Tensor, output: torch.Tensor
    ) -> None:
        """Called by the session after each hop step, before the step's inputs join the session's
        history (client/hop_check.py): keeps the output and maybe checks the span's run so far.
        Only a peer of the hop's weight format can witness (a quantized peer computes the model
        quantized, which is not a lie)."""
        start, end = hop.start, hop.end
        self.stats.steps += 1
        self.tally.setdefault((start, end), SpanTally()).steps += 1
        served = self.served.setdefault((start, end), [])
        served.append(Served(position, hop.conn.peer_id, output, hop.conn, hop.session_id))
        self.quants[start, end] = hop.quant
        run_tokens = position + output.shape[1] - served[0].position
        if self.rng.random() >= self.share and run_tokens < MAX_RUN_TOKENS:
            return
        self.stats.sampled += 1
        past = self.session.history.sent_before(start, position, hidden_in)
        await self._check_span(start, end, past, hidden_in)

    def rolled_back(self, position: int) -> None:
        """Forgets what hops served from `position` on (drafts the client rejected, never output);
        a shadow that saw them steps from `position` next, which rolls the witness back too."""
        for span, served in self.served.items():
            drafts = [s for s in served if s.position >= position]
            self.stats.steps -= len(drafts)
            self.tally[span].steps -= len(drafts)
            self.served[span] = [
                replace(s, output=s.output[:, : position - s.position])
                for s in served
                if s.position < position
            ]
        for shadow in self.shadows.values():
            shadow.position = min(shadow.position, position)

    async def finish(self) -> None:
        """Checks every span's steps not checked yet (a generation is about to return)."""
        for start, end in list(self.served):
            if self.served.get((start, end)):
                self.stats.sampled += 1
                await self._check_span(start, end, self.session.history.sent_whole(start), None)

    async def _check_span(self, start: int, end: int, past, hidden_in) -> None:
        served = self.served.pop((start, end), [])
        if past is None:
            self.stats.uncompared[NOT_KEPT] += len(served)
            return
        inputs = past if hidden_in is None else torch.cat([past, hidden_in], dim=1)
        served = [s for s in served if s.position + s.output.shape[1] <= inputs.shape[1]]
        if served:
            await self._check(Run(start, end, self.quants[start, end], inputs, served))

    async def _check(self, run: Run) -> None:
        records = await self._candidates(run, exclude=run.servers)
        if not records:
            self.stats.uncompared[NO_WITNESS] += len(run.served)
            return
        witness = self._witness(run, records)
        theirs = await self._recompute(witness, run)
        if theirs is None:
            self.stats.uncompared[WITNESS_FAILED] += len(run.served)
            return
        first = self._compare(run.outputs, theirs, [*run.servers, witness.peer_id])
        if first.agree:
            self._compared(run)
            return
        self.stats.mismatches += 1
        logger.info(
            "blocks [%d:%d): the served outputs and witness %s's disagree (%s); asking a third peer",
            run.start,
            run.end,
            witness.name,
            first.describe(),
        )
        await self._settle(run, witness, theirs, first)

    def summary(self) -> dict:
        """This session's steps and comparisons, per span and in all (the API reports it)."""
        spans = [
            {"blocks": f"{start}:{end}", "steps": t.steps, "compared": t.compared}
            for (start, end), t in sorted(self.tally.items())
        ]
        return {
            "steps": sum(s["steps"] for s in spans),
            "compared": sum(s["compared"] for s in spans),
            "unchecked_spans": [s["blocks"] for s in spans if s["steps"] and not s["compared"]],
            "spans": spans,
            "disagreed": self.stats.mismatches,  # steps where the server and a witness disagreed
            "liars_caught": self.stats.liars,
            "disputes": [d.describe() for d in self.disputes],  # disagreements nobody settled
        }

    def _compared(self, run: Run) -> None:
        self.stats.compared += len(run.served)
        self.tally.setdefault((run.start, run.end), SpanTally()).compared += len(run.served)

    def _witness(self, run: Run, records: list[PeerRecord]) -> PeerRecord:
        """The span's witness so far if it still qualifies (its shadow has caught up), else a new one."""
        current = self.witness_of.get((run.start, run.end))
        for record in records:
            if record.peer_id == current:
                return record
        witness = self._pick(records, avoid=list(run.servers))
        self.witness_of[run.start, run.end] = witness.peer_id
        return witness

    async def _settle(self, run: Run, witness: PeerRecord, theirs: torch.Tensor, first: Comparison) -> None:
        """The served outputs and the witness's disagree: a third peer's recomputation names the
        liar, if it can; up to MAX_THIRD_OPINIONS of them are asked in turn. Unsettled, the run
        is a Dispute, which the generation may not return as checked (client/model.py)."""
        asked, why = [*run.servers, witness.peer_id], "no third peer serves the blocks in that format"
        for _ in range(MAX_THIRD_OPINIONS):
            others = await self._candidates(run, exclude=set(asked))
            if not others:
                break
            third = self._pick(others, avoid=asked)
            asked.append(third.peer_id)
            verdict = await self._recompute(third, run, fresh=True)
            if verdict is None:
                why = f"the third peer {third.name} failed"
                continue
            sides_with_servers = self._compare(run.outputs, verdict, [*run.servers, third.peer_id]).agree
            sides_with_witness = self._compare(theirs, verdict, [witness.peer_id, third.peer_id]).agree
            if sides_with_servers != sides_with_witness:
                await self._settled(run, witness, theirs, first, third, verdict, sides_with_servers)
                return
            why = f"the third peer {third.name} agreed with {'both' if sides_with_servers else 'neither'}"
        self.stats.uncompared[DISPUTED] += len(run.served)
        servers = tuple(self.session.name(p) for p in sorted(run.servers))
        self.disputes.append(Dispute(run.start, run.end, run.first, servers, witness.name, why))
        logger.warning(
            "blocks [%d:%d): the server and witness %s disagree and %s; blaming nobody",
            run.start,
            run.end,
            witness.name,
            why,
        )

    async def _settled(
        self, run: Run, witness, theirs, first: Comparison, third, verdict, servers_right: bool
    ):
        """The third peer sided with one of the two: the other is the liar."""
        if servers_right:
            served = self.witness_steps.get(witness.peer_id) or Served(run.first, witness.peer_id, theirs)
            await self._convict(served, run, verdict, third, first)
            self._forget_witness(run, witness.peer_id)
            return
        bad = self._first_wrong(run, verdict)
        log = bad.conn.logs.get(bad.session_id) if bad.conn is not None else None
        if log is not None and log.first > 0:  # its cache came from a prefill peer's push
            self.stats.uncompared[PUSHED_CACHE] += len(run.served)
            logger.warning(
                "blocks [%d:%d): %s's outputs are wrong, but its prompt's keys and values came from a "
                "prefill peer; blaming nobody",
                run.start,
                run.end,
                self.session.name(bad.peer_id),
            )
            return
        await self._convict(bad, run, verdict, third, first)
        name = self.session.name(bad.peer_id)
        raise VerificationError(
            name,
            bad.peer_id,
            f"its output for blocks [{run.start}:{run.end}) at token {bad.position} is wrong: {first.describe()}",
            position=bad.position,
        )

    def _first_wrong(self, run: Run, verdict: torch.Tensor) -> Served:
        """The first served step the third peer's outputs disagree with (the first of the run if
        only the run as a whole is off)."""
        offset = 0
        for served in run.served:
            n = served.output.shape[1]
            if not self._compare(served.output, verdict[:, offset : offset + n], [served.peer_id]).agree:
                return served
            offset += n
        return run.served[0]

    async def _convict(self, bad: Served, run: Run, verdict, third: PeerRecord, first: Comparison) -> None:
        self._compared(run)  # settled: the third peer sided with one of the two
        self.stats.liars += 1
        offset = max(0, bad.position - run.first)
        good = verdict[:, offset : offset + bad.output.shape[1]]
        evidence = await evidence_of_lie(bad, run)
        report = Report(
            reporter="",
            reported=bad.peer_id,
            model_id=self.spec.model_id,
            start=run.start,
            end=run.end,
            position=bad.position,
            input_hash=tensor_hash(run.inputs[:, : bad.position + bad.output.shape[1]]),
            reported_output_hash=tensor_hash(bad.output),
            witness=third.peer_id,
            witness_output_hash=tensor_hash(good),
            max_abs_diff=float((bad.output.float() - good.float()).abs().max()),
            tie_breaker=third.peer_id,
            time=get_dht_time(),
            evidence=evidence.digest() if evidence is not None else "",
        )
        self._ban(bad.peer_id)
        weaker = self._weaker_guarantee(third, [bad.peer_id, *run.servers])
        reason = f"wrong output for blocks [{run.start}:{run.end}) ({first.describe()}){weaker}"
        add_ban(new_ban(bad.peer_id, self.spec.model_id, run.start, run.end, reason))
        await publish_report_signed(self.swarm.dht, report)
        if evidence is not None:  # peers that serve the blocks re-check it and pass it on
            self.swarm.spawn(share_evidence(self.swarm, evidence, self._records[1], self.rng))
        logger.warning(
            "peer %s returned a wrong output for blocks [%d:%d) at token %d (%s agrees%s); banned and reported",
            self.session.name(bad.peer_id),
            run.start,
            run.end,
            bad.position,
            third.name,
            weaker,
        )

    def _weaker_guarantee(self, third: PeerRecord, involved: list[str]) -> str:
        """What the verdict should say when the third peer is not of an IP group apart from the
        others (`_pick` takes one apart where it can; else any other identity, which one machine
        could run beside another of them)."""
        shared = self._groups(third.peer_id) & {g for p in involved for g in self._groups(p)}
        return f"; the third peer shares IP group {min(shared)}, a weaker guarantee" if shared else ""

    def _pick(self, records: list[PeerRecord], avoid: list[str]) -> PeerRecord:
        """A random one of `records`, from an IP group none of the `avoid` peers announce where
        there is one: peers behind one address may be one operator."""
        taken = {group for peer_id in avoid for group in self._groups(peer_id)}
        apart = [r for r in records if not self._groups(r.peer_id) & taken]
        return self.rng.choice(apart or records)

    def _groups(self, peer_id: str) -> set[str]:
        return record_groups(self._record(peer_id))

    async def _recompute(self, witness: PeerRecord, run: Run, fresh: bool = False) -> torch.Tensor | None:
        """The witness's outputs for the run's tokens, its shadow session caught up on the
        span's inputs in one step (from the start with `fresh`); None if it failed."""
        key = (witness.peer_id, run.start, run.end)
        try:
            shadow = None if fresh else self.shadows.get(key)
            if shadow is None or shadow.position > run.first:
                if shadow is not None:
                    shadow.conn.close()
                shadow = await self._open_shadow(witness, run.start, run.end)
            if not fresh:
                self.shadows[key] = shadow
            chunk = run.inputs[:, shadow.position :]  # the inputs it has not seen, in one step
            result = await shadow.conn.step(shadow.session_id, shadow.position, chunk)
            first = run.first - shadow.position
            self.witness_steps[witness.peer_id] = Served(
                shadow.position, witness.peer_id, result, shadow.conn, shadow.session_id
            )
            shadow.position = run.inputs.shape[1]
            if fresh:
                await close_sessions([(shadow.conn, shadow.session_id)])
            return result[:, first:]
        except PeerError as e:  # a witness that fails is not evidence against anyone
            logger.info("witness %s could not verify: %s", witness.name, e)
            self._forget_witness(run, witness.peer_id)
            return None

    def _forget_witness(self, run: Run, peer_id: str) -> None:
        shadow = self.shadows.pop((peer_id, run.start, run.end), None)
        if shadow is not None:
            shadow.conn.close()
        if self.witness_of.get((run.start, run.end)) == peer_id:
            del self.witness_of[run.start, run.end]

    async def _open_shadow(self, witness: PeerRecord, start: int, end: int) -> Shadow:
        s = self.session
        conn = await self.swarm.open_connection(witness.peer_id, witness.name, timeout=WITNESS_TIMEOUT_S)
        conn.timeout = WITNESS_TIMEOUT_S
        shadow_id = random_session_id()
        try:
            await conn.open(shadow_id, self.spec.model_id, start, end, s.max_length, s.batch_size, s.dtype)
        except BaseException:
            conn.close()
            raise
        return Shadow(conn, shadow_id, witness.peer_id)

    def _compare(self, ours: torch.Tensor, theirs: torch.Tensor, peers: list[str]) -> Comparison:
        """`ours` against `theirs` at the tolerance of the coarsest format involved."""
        return compare(ours, theirs, TOLERANCES[self._format(peers)])

    def _format(self, peers: list[str]) -> str:
        """The coarsest of the wire dtype and each peer's compute dtype (int8 layers count as int8)."""
        formats = [DTYPE_NAMES.get(self.session.dtype, "float32")]
        formats += [record_format(r) for r in filter(None, map(self._record, peers))]
        return coarsest(formats)

    def _record(self, peer_id: str) -> PeerRecord | None:
        return next((r for r in self._records[1] if r.peer_id == peer_id), None)

    async def _candidates(self, run: Run, exclude: set[str]) -> list[PeerRecord]:
        loop = asyncio.get_running_loop()
        if loop.time() - self._records[0] > RECORDS_TTL_S:
            records = await asyncio.to_thread(
                self.swarm.online_records, self.spec.model_id, self.spec.num_blocks
            )
            self._records = (loop.time(), records)
        return [
            r
            for r in self._records[1]
            if r.start <= run.start
            and run.end <= r.end
            and r.peer_id not in exclude
            and r.peer_id not in self.swarm.distrusted
            and r.quant == run.quant
            and r.max_length >= self.session.max_length  # a shorter one would refuse the shadow
        ]

    def _ban(self, peer_id: str) -> None:
        self.swarm.distrusted.add(peer_id)
        self.swarm.forget(peer_id)
        for key in [k for k in self.shadows if k[0] == peer_id]:
            self.shadows.pop(key).conn.close()
        for span in [span for span, witness in self.witness_of.items() if witness == peer_id]:
            del self.witness_of[span]

    def close(self) -> None:
        if self.shadows:
            run_sync(self._close_shadows(), timeout=2 * CLOSE_TIMEOUT_S)

    async def _close_shadows(self) -> None:
        shadows, self.shadows = list(self.shadows.values()), {}
        await close_sessions([(shadow.conn, shadow.session_id) for shadow in shadows])
