"""A peer's side of travelling evidence (swarm/trust/evidence_wire.py): it re-checks what it is sent,
bans proven liars, keeps their evidence and hands it out.

A submission is remote input like any other: its size is capped before it is read, a remote
and an IP group submit at a bounded rate, one re-check runs at a time (others wait in a short
queue or are refused BUSY), and a digest already judged is answered from memory. A re-check
is one prefill-shaped step of at most MAX_EVIDENCE_TOKENS tokens through this peer's own
compute thread (peer/scheduler.py), as a session of an owner no remote can be, so it competes
with the serving sessions on the same terms as any client and uses the same memory budget.

Only what this peer proved itself changes anything: the liar goes into this machine's bans
(swarm/trust/bans.py), its streams are refused from then on, and the evidence is kept (the newest
MAX_KEPT) and announced in the DHT, where clients find it and re-check it their own way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from hexswarm.peer.core import PeerCore, session_key
from hexswarm.swarm.trust.bans import add_ban, load_bans, new_ban
from hexswarm.swarm.trust.evidence import Evidence, evidence_dir, recheck, save_evidence
from hexswarm.swarm.trust.evidence_wire import (
    CANNOT_CHECK,
    HOLDING_TTL_S,
    MAX_REQUEST_HEADER_BYTES,
    MAX_WIRE_EVIDENCE_BYTES,
    NOT_PROVEN,
    PROVEN,
    Holding,
    decode_message,
    encode_message,
    publish_holding,
)
from hexswarm.swarm.trust.rates import KeyedRate
from hexswarm.swarm.wire.checks import ErrorCode, ProtocolError
from hexswarm.swarm.wire.frames import read_payload
from hexswarm.swarm.wire.protocol import Open, Step
from hexswarm.swarm.wire.tensors import DTYPE_NAMES

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 60.0  # to read a request (64 MiB over a slow home link)
RECHECK_OWNER = "evidence-recheck"  # the namespace of re-check sessions: not a base58 peer id
MAX_KEPT = 64  # proven evidence kept and served (the newest), in memory and on disk
MAX_KEPT_BYTES = 512 << 20
MAX_VERDICTS = 1024  # digests remembered with their verdicts


@dataclass(frozen=True)
class EvidenceLimits:
    """How much re-checking a peer does for others."""

    submits_per_minute_per_remote: float = 2.0
    submits_per_minute_per_group: float = 6.0  # identities cost nothing, machines do
    gets_per_minute_per_remote: float = 6.0
    max_waiting: int = 2  # re-checks queued behind the running one; more are refused BUSY


class EvidenceService:
    """Serves EVIDENCE_PROTOCOL on a peer: SUBMIT (re-check) and GET (hand out what it proved)."""

    def __init__(self, core: PeerCore, scheduler, dht, identity, own_format: str, group_of, limits=None):
        self.core, self.scheduler, self.dht, self.identity = core, scheduler, dht, identity
        self.own_format = own_format  # the format this peer computes in (a dtype name, or "int8")
        self.group_of = group_of  # async: remote peer id -> its IP group
        self.limits = limits or EvidenceLimits()
        self.submits = KeyedRate(self.limits.submits_per_minute_per_remote)
        self.group_submits = KeyedRate(self.limits.submits_per_minute_per_group)
        self.gets = KeyedRate(self.limits.gets_per_minute_per_remote)
        self.verdicts: OrderedDict[str, tuple[str, str]] = OrderedDict()  # digest -> (verdict, detail)
        self.kept: OrderedDict[str, bytes] = OrderedDict()  # digest -> proven evidence
        self.banned: set[str] = set(load_bans())
        self.lock = asyncio.Lock()  # one re-check at a time
        self.waiting = 0

    async def handle_stream(
        self, stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote = stream_info.peer_id.to_base58()
        try:
            try:
                payload = await asyncio.wait_for(
                    read_payload(reader, MAX_WIRE_EVIDENCE_BYTES + MAX_REQUEST_HEADER_BYTES),
                    REQUEST_TIMEOUT_S,
                )
                reply = await self.answer(decode_message(payload), remote)
            except ValueError as e:
                raise ProtocolError(ErrorCode.MALFORMED, str(e)) from None
        except ProtocolError as e:
            logger.info("refused evidence request from ...%s: %s", remote[-8:], e)
            reply = {"error": e.message, "code": int(e.code)}
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            writer.close()
            return
        try:
            writer.write(encode_message(reply))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def answer(self, request: dict, remote: str) -> dict:
        op = request.get("op")
        if op == "get":
            return self._get(request.get("digest"), remote)
        if op == "submit" and isinstance(request.get("evidence"), bytes):
            return await self._submit(request["evidence"], remote)
        raise ProtocolError(ErrorCode.MALFORMED, "expected {op: submit, evidence} or {op: get, digest}")

    def _get(self, digest, remote: str) -> dict:
        if not self.gets.take(remote, time.monotonic()):
            raise ProtocolError(ErrorCode.RATE_LIMITED, "too many evidence requests; retry in a minute")
        if not isinstance(digest, str) or digest not in self.kept:
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, "no such evidence here")
        return {"evidence": self.kept[digest]}

    async def _submit(self, data: bytes, remote: str) -> dict:
        try:
            evidence = Evidence.from_bytes(data)
        except ValueError as e:
            raise ProtocolError(ErrorCode.MALFORMED, str(e)) from None
        digest = evidence.digest()
        if digest in self.verdicts:
            verdict, detail = self.verdicts[digest]
            return {"verdict": verdict, "detail": detail}
        now = time.monotonic()
        group = await self.group_of(remote)
        if not self.submits.take(remote, now) or not self.group_submits.take(group, now):
            raise ProtocolError(ErrorCode.RATE_LIMITED, "too much evidence from this remote or its network")
        if self.lock.locked() and self.waiting >= self.limits.max_waiting:
            raise ProtocolError(ErrorCode.BUSY, "re-checking other evidence; retry later")
        self.waiting += 1
        waited = False
        try:
            async with self.lock:
                self.waiting, waited = self.waiting - 1, True
                verdict, detail = await self._judge(evidence)
        finally:
            if not waited:  # cancelled while queued
                self.waiting -= 1
        if verdict != CANNOT_CHECK:
            self._remember(self.verdicts, digest, (verdict, detail), MAX_VERDICTS)
        if verdict == PROVEN:
            await self._act_on_proof(evidence, data, digest, detail, remote)
        logger.info(
            "evidence from ...%s against ...%s: %s (%s)", remote[-8:], evidence.peer_id[-8:], verdict, detail
        )
        return {"verdict": verdict, "detail": detail}

    async def _judge(self, evidence: Evidence) -> tuple[str, str]:
        """(verdict, detail): PROVEN when this peer's own recomputation disagrees with the signed output."""
        s, blocks = evidence.session, self.core.blocks
        if s.model_id != self.core.model_id or not blocks.start <= s.start < s.end <= blocks.end:
            return CANNOT_CHECK, f"this peer serves {self.core.model_id} blocks [{blocks.start}:{blocks.end})"
        if (evidence.format == "int8") != (self.own_format == "int8"):
            return CANNOT_CHECK, f"the output is {evidence.format}, this peer computes in {self.own_format}"
        if evidence.peer_id == self.identity.peer_id.to_base58():
            return CANNOT_CHECK, "it is about this peer"
        try:
            evidence.check()
        except ValueError as e:
            raise ProtocolError(ErrorCode.MALFORMED, f"the evidence does not hold together: {e}") from None
        outputs = await self._recompute(evidence)
        result = recheck(evidence, outputs, self.own_format)
        return (NOT_PROVEN if result.agree else PROVEN), result.describe()

    async def _recompute(self, evidence: Evidence):
        """The blocks on the evidence's inputs, as one step of a session of our own."""
        s, inputs = evidence.session, evidence.inputs
        if inputs.dtype not in DTYPE_NAMES:
            raise ProtocolError(ErrorCode.BAD_TENSOR, f"inputs of dtype {inputs.dtype}")
        session_id = evidence.digest()[:32]
        open_request = Open(
            session_id,
            s.model_id,
            s.start,
            s.end,
            inputs.shape[1],
            inputs.shape[0],
            DTYPE_NAMES[inputs.dtype],
        )
        self.core.open(open_request, RECHECK_OWNER)  # ProtocolError (BUSY, TOO_LONG) goes back as is
        key = session_key(RECHECK_OWNER, session_id)
        try:
            session, hidden = self.core.begin_step(Step(session_id, 0, inputs), RECHECK_OWNER)
            result = await asyncio.wrap_future(self.scheduler.submit(session, hidden).future)
            return result.hidden
        finally:
            self.core.drop(key)

    async def _act_on_proof(
        self, evidence: Evidence, data: bytes, digest: str, detail: str, remote: str
    ) -> None:
        s = evidence.session
        self.banned.add(evidence.peer_id)
        reason = f"re-checked evidence {digest[:16]} sent by ...{remote[-8:]} ({detail})"
        await asyncio.to_thread(add_ban, new_ban(evidence.peer_id, s.model_id, s.start, s.end, reason))
        await asyncio.to_thread(save_evidence, evidence, MAX_KEPT)
        self._remember(self.kept, digest, data, MAX_KEPT)
        while sum(map(len, self.kept.values())) > MAX_KEPT_BYTES and len(self.kept) > 1:
            self.kept.popitem(last=False)
        logger.warning(
            "peer ...%s proven to have signed a wrong output for %s blocks [%d:%d); banned, evidence in %s",
            evidence.peer_id[-8:],
            s.model_id,
            s.start,
            s.end,
            evidence_dir(),
        )
        holding = Holding(
            self.identity.peer_id.to_base58(), evidence.peer_id, digest, s.start, s.end, len(data)
        )
        await self.announce(holding, s.model_id)

    async def announce(self, holding: Holding, model_id: str) -> None:
        from hivemind.utils import get_dht_time

        future = publish_holding(
            self.dht, self.identity.owner_marker, model_id, holding, get_dht_time() + HOLDING_TTL_S
        )
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), 10.0)
        except Exception as e:  # the ban holds even if the DHT does not answer
            logger.warning(
                "could not announce the evidence against ...%s: %s", holding.liar[-8:], type(e).__name__
            )

    @staticmethod
    def _remember(table: OrderedDict, key: str, value, limit: int) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > limit:
            table.popitem(last=False)
