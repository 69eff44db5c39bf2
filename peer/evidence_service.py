"""A peer's side of travelling evidence (swarm/trust/evidence_wire.py): it re-checks what it is sent,
bans proven liars, keeps their evidence and hands it out.

A request is remote input like any other, and costs the peer nothing before its limits apply
(peer/evidence_gate.py): its size is judged from its length prefix, and a slot and the rates of
its remote and IP group are taken before its body is read (a GET, small, is read first and then
counted the same way). Then the cheap part: the claim at the front of the evidence (who signed
which steps) is unpacked without the tensors and its signature checked, and only then is the
whole parsed and digested, on a worker thread, never on the serving event loop. A digest already
judged is answered from memory; one re-check runs at a time (others wait in a short queue or are
refused BUSY). A re-check costs compute, so each IP group (else remote) has a budget of rows x
tokens re-checked a minute (`EvidenceLimits.recheck_tokens_per_minute_per_group`), taken once
the evidence's shape is known. A re-check is one prefill-shaped step of at most
MAX_EVIDENCE_TOKENS tokens through this peer's own compute thread (peer/scheduler.py), as a
session of an owner no remote can be, at background priority: its chunks run only in rounds
where no client's prompt waits, so a flood of evidence delays clients' tokens by at most a chunk
per round, and it uses the same memory budget.

Only what this peer proved itself changes anything: the liar goes into this machine's bans
(swarm/trust/bans.py), its streams are refused from then on, and the evidence is kept (the newest
MAX_KEPT, in the cache folder's evidence-received/, apart from what the operator's own clients
proved) and announced in the DHT, where clients find it and re-check it their own way.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import OrderedDict
from contextlib import ExitStack
from pathlib import Path

from hexswarm.peer.core import PeerCore, session_key
from hexswarm.peer.evidence_gate import GET, SUBMIT, EvidenceGate, EvidenceLimits
from hexswarm.swarm.trust.bans import BANS_REFRESH_S, add_ban, load_bans, new_ban
from hexswarm.swarm.trust.evidence import (
    Evidence,
    read_claim,
    received_evidence_dir,
    recheck,
    save_evidence,
)
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
from hexswarm.swarm.wire.checks import ErrorCode, ProtocolError
from hexswarm.swarm.wire.frames import FrameTooLarge
from hexswarm.swarm.wire.protocol import Open, Step
from hexswarm.swarm.wire.tensors import DTYPE_NAMES

__all__ = ["EvidenceLimits", "EvidenceService"]

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 60.0  # to read a request (64 MiB over a slow home link)
RECHECK_OWNER = "evidence-recheck"  # the namespace of re-check sessions: not a base58 peer id
MAX_KEPT = 64  # proven evidence kept and served (the newest), on disk
MAX_VERDICTS = 1024  # digests remembered with their verdicts
_LENGTH = struct.Struct(">I")  # a frame's length prefix (swarm/wire/frames.py)


class EvidenceService:
    """Serves EVIDENCE_PROTOCOL on a peer: SUBMIT (re-check) and GET (hand out what it proved)."""

    def __init__(self, core: PeerCore, scheduler, dht, identity, own_format: str, group_of, limits=None):
        self.core, self.scheduler, self.dht, self.identity = core, scheduler, dht, identity
        self.own_format = own_format  # the format this peer computes in (a dtype name, or "int8")
        self.group_of = group_of  # async: remote peer id -> its IP group (None: loopback)
        self.limits = limits or EvidenceLimits()
        self.gate = EvidenceGate(self.limits)
        self.verdicts: OrderedDict[str, tuple[str, str]] = OrderedDict()  # digest -> (verdict, detail)
        self.kept: OrderedDict[str, Path] = OrderedDict()  # digest -> the file of proven evidence
        self.on_file: set[str] = set(load_bans())  # the bans file as last read
        self.banned: set[str] = set(self.on_file)  # refused by the stream server (peer/server.py)
        self.lock = asyncio.Lock()  # one re-check at a time
        self.waiting = 0

    async def handle_stream(
        self, stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote = stream_info.peer_id.to_base58()
        with ExitStack() as slot:  # the gate's slot, held until the reply is sent
            try:
                reply = await self._read_and_answer(reader, remote, slot)
            except ProtocolError as e:
                logger.info("refused evidence request from ...%s: %s", remote[-8:], e)
                reply = {"error": e.message, "code": int(e.code)}
            except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                writer.close()
                return
            try:  # a reply with evidence is up to 64 MiB: framed off the loop
                data = await asyncio.to_thread(encode_message, reply) if "evidence" in reply else None
                writer.write(data or encode_message(reply))
                await writer.drain()
            except ConnectionError:
                pass
            finally:
                writer.close()

    async def _read_and_answer(self, reader: asyncio.StreamReader, remote: str, slot: ExitStack) -> dict:
        """Reads one request, its limits taken before its body is read where it is large, and answers it."""
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        (size,) = _LENGTH.unpack(await asyncio.wait_for(reader.readexactly(_LENGTH.size), REQUEST_TIMEOUT_S))
        if size > MAX_WIRE_EVIDENCE_BYTES + MAX_REQUEST_HEADER_BYTES:
            raise FrameTooLarge(size, MAX_WIRE_EVIDENCE_BYTES + MAX_REQUEST_HEADER_BYTES)
        group = await self.group_of(remote)
        large = size > MAX_REQUEST_HEADER_BYTES  # only a submission is larger than a header
        if large:
            self._admit(SUBMIT, remote, group, slot, size)
        payload = await asyncio.wait_for(reader.readexactly(size), max(0.0, deadline - time.monotonic()))
        try:
            request = await asyncio.to_thread(decode_message, payload) if large else decode_message(payload)
        except ValueError as e:
            raise ProtocolError(ErrorCode.MALFORMED, str(e)) from None
        if large and request.get("op") != SUBMIT:
            raise ProtocolError(ErrorCode.MALFORMED, "only a submission is larger than a header")
        if not large:
            self._admit(_kind(request), remote, group, slot)
        return await self._answer(request, remote, group)

    def _admit(self, kind: str, remote: str, group: str | None, slot: ExitStack, size: int = 0) -> None:
        self.gate.admit(kind, remote, group, time.monotonic(), size)  # RATE_LIMITED, BUSY: nothing taken
        slot.callback(self.gate.release, group)

    async def answer(self, request: dict, remote: str) -> dict:
        """The reply to one request of `remote`, its limits taken as on a stream (without one)."""
        group = await self.group_of(remote)
        with ExitStack() as slot:
            self._admit(_kind(request), remote, group, slot)
            return await self._answer(request, remote, group)

    async def _answer(self, request: dict, remote: str, group: str | None) -> dict:
        op = request.get("op")
        if op == GET:
            return await self._get(request.get("digest"), remote, group)
        if op == SUBMIT and isinstance(request.get("evidence"), bytes):
            return await self._submit(request["evidence"], remote, group)
        raise ProtocolError(ErrorCode.MALFORMED, "expected {op: submit, evidence} or {op: get, digest}")

    async def _get(self, digest, remote: str, group: str | None) -> dict:
        path = self.kept.get(digest) if isinstance(digest, str) else None
        try:
            if path is not None:  # the bytes it would send are budgeted before it reads them
                self.gate.take_sent(remote, group, path.stat().st_size, time.monotonic())
            data = await asyncio.to_thread(path.read_bytes) if path is not None else None
        except OSError:  # pruned from the folder meanwhile (another process of this machine)
            data = None
        if data is None:
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, "no such evidence here")
        return {"evidence": data}

    async def _submit(self, data: bytes, remote: str, group: str | None) -> dict:
        try:  # the claim first (no tensors decoded): evidence this peer cannot judge or a forged signature
            claim = await asyncio.to_thread(read_claim, data)
            if (why := self._cannot_check(claim.session, claim.peer_id, claim.session.format)) is not None:
                return {"verdict": CANNOT_CHECK, "detail": why}
            await asyncio.to_thread(claim.check)
            evidence, digest = await asyncio.to_thread(_parse, data)
        except ValueError as e:
            raise ProtocolError(ErrorCode.MALFORMED, f"the evidence does not hold together: {e}") from None
        if digest in self.verdicts:
            verdict, detail = self.verdicts[digest]
            return {"verdict": verdict, "detail": detail}
        rows, tokens = evidence.inputs.shape[:2]
        self.gate.take_recheck(remote, group, rows * tokens, time.monotonic())  # RATE_LIMITED
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
            await self._act_on_proof(evidence, digest, detail, remote)
        logger.info(
            "evidence from ...%s against ...%s: %s (%s)", remote[-8:], evidence.peer_id[-8:], verdict, detail
        )
        return {"verdict": verdict, "detail": detail}

    def _cannot_check(self, session, peer_id: str, fmt: str) -> str | None:
        """Why this peer cannot judge evidence about `session` of `peer_id` in format `fmt` (None: it can)."""
        blocks = self.core.blocks
        if (
            session.model_id != self.core.model_id
            or not blocks.start <= session.start < session.end <= blocks.end
        ):
            return f"this peer serves {self.core.model_id} blocks [{blocks.start}:{blocks.end})"
        if (fmt == "int8") != (self.own_format == "int8"):
            return f"the output is {fmt}, this peer computes in {self.own_format}"
        if peer_id == self.identity.peer_id.to_base58():
            return "it is about this peer"
        return None

    async def _judge(self, evidence: Evidence) -> tuple[str, str]:
        """(verdict, detail): PROVEN when this peer's own recomputation disagrees with the signed output."""
        if (why := self._cannot_check(evidence.session, evidence.peer_id, evidence.format)) is not None:
            return CANNOT_CHECK, why
        try:
            await asyncio.to_thread(evidence.check)  # hashes the inputs: off the loop
        except ValueError as e:
            raise ProtocolError(ErrorCode.MALFORMED, f"the evidence does not hold together: {e}") from None
        outputs = await self._recompute(evidence)
        result = await asyncio.to_thread(recheck, evidence, outputs, self.own_format)
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
            result = await asyncio.wrap_future(self.scheduler.submit(session, hidden, background=True).future)
            return result.hidden
        finally:
            self.core.drop(key)

    async def _act_on_proof(self, evidence: Evidence, digest: str, detail: str, remote: str) -> None:
        s = evidence.session
        self.banned.add(evidence.peer_id)
        reason = f"re-checked evidence {digest[:16]} sent by ...{remote[-8:]} ({detail})"
        await asyncio.to_thread(add_ban, new_ban(evidence.peer_id, s.model_id, s.start, s.end, reason))
        self.on_file.add(evidence.peer_id)  # on file now: lifting it there lifts it here
        path = await asyncio.to_thread(save_evidence, evidence, MAX_KEPT, received_evidence_dir())
        self._remember(self.kept, digest, path, MAX_KEPT)
        logger.warning(
            "peer ...%s proven to have signed a wrong output for %s blocks [%d:%d); banned, evidence in %s",
            evidence.peer_id[-8:],
            s.model_id,
            s.start,
            s.end,
            received_evidence_dir(),
        )
        holding = Holding(
            self.identity.peer_id.to_base58(), evidence.peer_id, digest, s.start, s.end, path.stat().st_size
        )
        await self.announce(holding, s.model_id)

    async def watch_bans(self, stop: asyncio.Event) -> None:
        """Until `stop`, reads the bans file every BANS_REFRESH_S (`refresh_bans`)."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), BANS_REFRESH_S)
            except TimeoutError:
                await self.refresh_bans()

    async def refresh_bans(self) -> None:
        """Makes `banned` follow the bans file: a ban lifted there (`hexswarm bans --lift`) or
        expired (BAN_TTL_S) stops refusing its peer, and one another process of this machine wrote
        (its clients, `hexswarm recheck --ban`) starts. A ban proven here and not yet on file stays."""
        bans = set(await asyncio.to_thread(load_bans))
        self.banned.difference_update(self.on_file - bans)
        self.banned.update(bans)
        self.on_file = bans

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


def _kind(request: dict) -> str:
    """The limits a request counts against: a GET's, or a submission's (anything else too)."""
    return GET if request.get("op") == GET else SUBMIT


def _parse(data: bytes) -> tuple[Evidence, str]:
    """The evidence and its digest: the heavy part (tensors decoded, re-encoded, hashed)."""
    evidence = Evidence.from_bytes(data)
    return evidence, evidence.digest()
