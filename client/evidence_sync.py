"""A client's side of travelling evidence (swarm/trust/evidence_wire.py): it shares what it proved,
and re-checks what others announce before it bans anyone.

Sharing: when this client's verification proves a lie (client/verify.py), it submits the
evidence to SHARE_WITH peers that serve the liar's blocks in its weight format, from distinct
IP groups. Each re-checks it by recomputing, and if the lie holds, bans the liar and announces
that it holds the evidence.

Re-checking: from time to time (each EVIDENCE_ROUND_S while it verifies, and at start) a client
reads those announcements for its model. For a few announced liars that are online and not
banned here yet, it fetches the evidence from the announcing peer, checks that it holds
together (the liar's signature over its commitments, the inputs and output they name), and has
the inputs recomputed by a peer that serves the blocks, not the liar, preferably not the holder
and from another IP group than the holder. If that peer agrees with the signed output, nothing
is proven. If it disagrees, a second peer (from yet another group where there is one; the
holder, recomputing like any witness, comes last) must disagree too before this client bans
the liar: the same two-opinion rule as its own verification. The holder's announcement counts
for nothing; only recomputations do. Work is bounded: at most
MAX_PER_ROUND re-checks a round, each digest judged once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import Iterable

import torch

from hexswarm.client.group_cap import record_groups
from hexswarm.client.remote import PeerError, close_sessions, random_session_id
from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT
from hexswarm.swarm.trust.bans import add_ban, new_ban
from hexswarm.swarm.trust.evidence import Evidence, recheck, save_evidence
from hexswarm.swarm.trust.evidence_wire import (
    NOT_PROVEN,
    PROVEN,
    EvidenceRefused,
    Holding,
    call,
    read_holdings,
)
from hexswarm.swarm.trust.records import PeerRecord

logger = logging.getLogger(__name__)

SHARE_WITH = 2  # peers a client submits its evidence to
SUBMIT_TIMEOUT_S = 120.0  # a peer's re-check: one prefill of up to MAX_EVIDENCE_TOKENS tokens
FETCH_TIMEOUT_S = 60.0
RECOMPUTE_TIMEOUT_S = 120.0
MAX_PER_ROUND = 2  # announced evidence re-checked per round
MAX_WITNESSES = 4  # peers asked to recompute one piece of evidence, at most
EVIDENCE_ROUND_S = 300.0
DISPUTED = "disputed"  # the witness disagreed with the signed output, and no third peer agreed
UNCHECKED = "unchecked"  # no evidence could be fetched, or no witness could recompute it


def record_format(record: PeerRecord) -> str:
    """The format a peer computes in, as tolerances name it (any quantized one counts as int8)."""
    return record.dtype if record.quant == DEFAULT_QUANT else "int8"


def able_to_recompute(
    records: Iterable[PeerRecord], evidence: Evidence, exclude: set[str]
) -> list[PeerRecord]:
    """Peers serving the evidence's blocks that can recompute them comparably (int8 for int8)."""
    s = evidence.session
    return [
        r
        for r in records
        if r.start <= s.start
        and s.end <= r.end
        and r.peer_id not in exclude
        and (record_format(r) == "int8") == (evidence.format == "int8")
    ]


def apart_from(records: list[PeerRecord], taken: set[str], rng: random.Random) -> list[PeerRecord]:
    """`records` shuffled, those outside the IP groups `taken` first."""
    records = list(records)
    rng.shuffle(records)
    return sorted(records, key=lambda r: bool(record_groups(r) & taken))


async def share_evidence(swarm, evidence: Evidence, records: list[PeerRecord], rng=None) -> dict[str, str]:
    """Submits `evidence` to up to SHARE_WITH peers that can re-check it; peer id -> its verdict."""
    rng = rng or random.Random()
    able = able_to_recompute(records, evidence, {evidence.peer_id})
    chosen: list[PeerRecord] = []
    taken: set[str] = set()
    while able and len(chosen) < SHARE_WITH:
        record = apart_from(able, taken, rng)[0]
        able.remove(record)
        chosen.append(record)
        taken |= record_groups(record)
    data = evidence.to_bytes()
    replies = await asyncio.gather(*(_submit(swarm, r.peer_id, data) for r in chosen), return_exceptions=True)
    verdicts = {}
    for record, reply in zip(chosen, replies, strict=True):
        verdicts[record.peer_id] = (
            reply if isinstance(reply, str) else f"failed: {type(reply).__name__}: {reply}"
        )
        logger.info(
            "evidence against %s shared with %s: %s",
            evidence.peer_id[-8:],
            record.name,
            verdicts[record.peer_id],
        )
    return verdicts


async def _submit(swarm, peer_id: str, data: bytes) -> str:
    reply = await call(swarm.dialer, peer_id, {"op": "submit", "evidence": data}, SUBMIT_TIMEOUT_S)
    return f"{reply.get('verdict')} ({reply.get('detail', '')})"


class EvidenceSync:
    """Re-checks the evidence peers announce for one model; bans only on its own re-check."""

    def __init__(self, swarm, spec, rng: random.Random | None = None):
        self.swarm, self.spec = swarm, spec
        self.rng = rng or random.Random()
        self.judged: dict[str, str] = {}  # digest -> verdict (each digest is judged once)
        self.running: asyncio.Future | None = None  # the round in flight, on the client loop
        self.last_round = float("-inf")

    async def round(self) -> dict[str, str]:
        """One round: liar peer id -> the verdict this client reached (PROVEN bans it)."""
        holdings = await asyncio.to_thread(read_holdings, self.swarm.dht, self.spec.model_id)
        records = await asyncio.to_thread(self.swarm.online_records, self.spec.model_id, self.spec.num_blocks)
        online = {r.peer_id for r in records}
        fresh = [
            h
            for h in holdings
            if h.liar in online and h.liar not in self.swarm.distrusted and h.digest not in self.judged
        ]
        self.rng.shuffle(fresh)
        verdicts: dict[str, str] = {}
        for holding in fresh:
            if len(verdicts) >= MAX_PER_ROUND:
                break
            if holding.liar in verdicts:
                continue
            verdicts[holding.liar] = await self.judge(holding, records)
        return verdicts

    async def round_logged(self) -> None:
        """A round in the background: what fails is logged, not raised."""
        try:
            verdicts = await self.round()
        except Exception as e:
            logger.info("re-checking announced evidence failed: %s: %s", type(e).__name__, e)
            return
        if verdicts:
            logger.info("announced evidence re-checked: %s", verdicts)

    async def judge(self, holding: Holding, records: list[PeerRecord]) -> str:
        evidence = await self._fetch(holding)
        if evidence is None:
            return UNCHECKED
        verdict = await self._recheck(evidence, holding, records)
        if verdict in (PROVEN, NOT_PROVEN, DISPUTED):
            self.judged[holding.digest] = verdict
        if verdict == PROVEN:
            self._ban(evidence, holding)
        else:
            logger.info("evidence against %s from %s: %s", holding.liar[-8:], holding.holder[-8:], verdict)
        return verdict

    async def _fetch(self, holding: Holding) -> Evidence | None:
        """The evidence from its holder, if it is what the holding names and holds together."""
        try:
            reply = await call(
                self.swarm.dialer, holding.holder, {"op": "get", "digest": holding.digest}, FETCH_TIMEOUT_S
            )
            data = reply.get("evidence")
            if not isinstance(data, bytes) or hashlib.sha256(data).hexdigest() != holding.digest:
                raise ValueError("it sent other bytes than its holding names")
            evidence = Evidence.from_bytes(data)
            s = evidence.session
            if (evidence.peer_id, s.model_id, s.start, s.end) != (
                holding.liar,
                self.spec.model_id,
                holding.start,
                holding.end,
            ):
                raise ValueError("the evidence is about another peer, model or blocks than the holding says")
            evidence.check()
            return evidence
        except (EvidenceRefused, ValueError, TimeoutError, ConnectionError, OSError) as e:
            logger.info("no evidence from %s against %s: %s", holding.holder[-8:], holding.liar[-8:], e)
            self.judged[holding.digest] = UNCHECKED  # a holder that cannot hand it out is not asked again
            return None

    async def _recheck(self, evidence: Evidence, holding: Holding, records: list[PeerRecord]) -> str:
        able = able_to_recompute(records, evidence, {evidence.peer_id, holding.holder})[: MAX_WITNESSES - 1]
        holder = next(
            iter(
                able_to_recompute(
                    [r for r in records if r.peer_id == holding.holder], evidence, {evidence.peer_id}
                )
            ),
            None,
        )
        taken, against = record_groups(holder), 0
        while able or holder is not None:
            if able:  # another peer than the holder, from another IP group where there is one
                record = apart_from(able, taken, self.rng)[0]
                able.remove(record)
            else:  # the holder last: it recomputes like any witness, its announcement proves nothing
                record, holder = holder, None
            outputs = await self._recompute(record, evidence)
            if outputs is None:
                continue
            if recheck(evidence, outputs, record_format(record)).agree:
                return NOT_PROVEN if against == 0 else DISPUTED
            against += 1
            taken |= record_groups(record)
            if against == 2:
                return PROVEN
        return DISPUTED if against else UNCHECKED

    async def _recompute(self, record: PeerRecord, evidence: Evidence) -> torch.Tensor | None:
        """`record`'s peer's outputs for the evidence's inputs, from one session of one step."""
        s, inputs = evidence.session, evidence.inputs
        session_id = random_session_id()
        try:
            conn = await self.swarm.open_connection(record.peer_id, record.name, timeout=RECOMPUTE_TIMEOUT_S)
        except PeerError as e:
            logger.info("%s cannot recompute evidence: %s", record.name, e)
            return None
        conn.timeout = RECOMPUTE_TIMEOUT_S
        try:
            await conn.open(
                session_id, s.model_id, s.start, s.end, inputs.shape[1], inputs.shape[0], inputs.dtype
            )
            outputs = await conn.step(session_id, 0, inputs)
            await close_sessions([(conn, session_id)])
            return outputs
        except PeerError as e:
            logger.info("%s could not recompute evidence: %s", record.name, e)
            return None
        finally:
            conn.close()

    def _ban(self, evidence: Evidence, holding: Holding) -> None:
        s = evidence.session
        self.swarm.distrusted.add(evidence.peer_id)
        self.swarm.forget(evidence.peer_id)
        reason = f"re-checked evidence {holding.digest[:16]} held by ...{holding.holder[-8:]}"
        add_ban(new_ban(evidence.peer_id, s.model_id, s.start, s.end, reason))
        save_evidence(evidence)
        logger.warning(
            "peer ...%s proven (re-checked by two peers) to have signed a wrong output for blocks [%d:%d); banned",
            evidence.peer_id[-8:],
            s.start,
            s.end,
        )
