"""A client's connection to one peer: one hivemind stream, request/response frames."""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time

import torch

from hexswarm.swarm.net.identity import peer_id_from_owner_marker
from hexswarm.swarm.trust.verify_tolerance import TOLERANCES
from hexswarm.swarm.wire.commitments import (
    CommitmentLog,
    SessionId,
    Signed,
    tensor_digest,
    verify_signature,
)
from hexswarm.swarm.wire.frames import read_frame, write_frame
from hexswarm.swarm.wire.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    SESSION_PROTOCOL,
    Attest,
    Attested,
    Close,
    Closed,
    Error,
    ErrorCode,
    KvTarget,
    Message,
    Open,
    Opened,
    Ping,
    Pong,
    ProtocolError,
    PushAck,
    Step,
    StepResult,
)
from hexswarm.swarm.wire.tensors import DTYPE_NAMES

logger = logging.getLogger(__name__)


class PeerError(RuntimeError):
    """A peer refused a request or failed to answer; says which peer and why."""

    def __init__(self, peer: str, code: ErrorCode | None, message: str, peer_id: str | None = None):
        self.peer, self.code, self.message, self.peer_id = peer, code, message, peer_id
        what = code.name if code is not None else "UNREACHABLE"
        super().__init__(f"peer {peer} refused: {what}: {message}")


_nonces = itertools.count(1)


class CommitmentMismatch(PeerError):
    """A pushed hop computed on an input other than the previous hop's output the client got:
    the previous peer sent the two different bytes, or this one says so falsely."""


class KvTransferError(RuntimeError):
    """A prefill peer computed the prompt, but its keys and values did not all reach the decode
    peers (one died or refused): the session serves the request colocated instead. Not a
    PeerError: the prefill peer that says so is not at fault."""


class PeerConnection:
    """One stream to one peer. Not thread-safe: one request at a time, on the client loop."""

    def __init__(
        self,
        peer_id: str,
        peer_name: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        timeout: float,
    ):
        self.peer_id, self.peer_name = peer_id, peer_name
        self.reader, self.writer = reader, writer
        self.timeout = timeout
        self.own_id = ""  # this client's peer id: whose sessions the peer's statements are about
        self.owner_marker = b""  # the peer's public key, from OPENED ("": it signs nothing)
        self.logs: dict[str, CommitmentLog] = {}  # session id -> its steps' commitments
        self.next_read: asyncio.Task | None = None  # the next frame's read, begun before it was asked for
        # After an early answer (Step.early): the read of its push's outcome, the stream's next frame
        self.outcome: asyncio.Task | None = None
        self.opening: asyncio.Task | None = None  # an OPEN sent without waiting: the read of its answer

    @classmethod
    async def connect(cls, p2p, peer_id, peer_name: str, timeout: float = 30.0) -> PeerConnection:
        try:
            _, reader, writer = await asyncio.wait_for(
                p2p.call_binary_stream_handler(peer_id, SESSION_PROTOCOL), timeout
            )
        except Exception as e:
            message = f"cannot open a stream: {type(e).__name__}: {e}"
            raise PeerError(peer_name, None, message, peer_id=peer_id.to_base58()) from None
        conn = cls(peer_id.to_base58(), peer_name, reader, writer, timeout)
        conn.own_id = p2p.peer_id.to_base58()
        return conn

    def _error(self, code: ErrorCode | None, message: str) -> PeerError:
        return PeerError(self.peer_name, code, message, peer_id=self.peer_id)

    async def request(self, message: Message, expect: type) -> Message:
        await self.send(message)
        return await self.receive(expect)

    async def send(self, message: Message) -> None:
        try:
            await write_frame(self.writer, message)
        except (ConnectionError, OSError, RuntimeError) as e:
            raise self._error(None, f"{type(e).__name__}: {e or 'cannot send'}") from None

    async def receive(self, expect: type) -> Message:
        """The next frame, within `timeout`; an ERROR frame or anything but `expect` is a PeerError.
        A push outcome still to come is read first (it was used already, or it is moot now), and
        the answer to an OPEN sent without waiting before that: a refused OPEN raises here."""
        if self.opening is not None:
            opening, self.opening = self.opening, None
            await opening
        if self.outcome is not None:
            outcome, self.outcome = self.outcome, None
            await asyncio.wait({outcome})  # it has its own deadline
            if not outcome.cancelled():
                outcome.exception()  # read, so it is not logged as never retrieved
        return await self._frame(expect, self.timeout)

    def arrival(self) -> asyncio.Task:
        """The read of the next frame, begun now if it was not: done once a frame (or the stream's
        end) has come. `receive` returns that frame."""
        if self.next_read is None:
            self.next_read = asyncio.ensure_future(read_frame(self.reader, DEFAULT_MAX_FRAME_BYTES))
        return self.next_read

    async def answer_begun(self) -> None:
        """Returns once the next frame after any push outcome still to come has begun to arrive
        (or the stream ended): an answer, for a stream whose step is out."""
        for before in (self.opening, self.outcome):
            if before is not None:
                await asyncio.wait({before})
        await asyncio.wait({self.arrival()})

    def expect_outcome(self, session_id: str, timeout: float) -> asyncio.Task:
        """After an early answer: reads the PUSH_ACK that says whether its push reached the next
        hop; the task returns why not ("" if it did) or raises PeerError."""
        self.outcome = asyncio.ensure_future(self._push_outcome(session_id, timeout))
        return self.outcome

    async def _push_outcome(self, session_id: str, timeout: float) -> str:
        ack = await self._frame(PushAck, timeout)
        if ack.session_id != session_id:
            raise self._error(ErrorCode.MALFORMED, f"push outcome for session {ack.session_id!r}")
        return "" if ack.code == 0 else ack.message or "the push failed"

    async def _frame(self, expect: type, timeout: float) -> Message:
        reading = self.arrival()
        try:
            reply = await asyncio.wait_for(asyncio.shield(reading), timeout)
        except ProtocolError as e:
            raise self._error(e.code, f"sent a bad reply: {e.message}") from None
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, OSError) as e:
            raise self._error(None, f"{type(e).__name__}: {e or 'no reply'}") from None
        finally:
            reading.cancel()  # a no-op once it is done; a read given up on must not take the next frame
            self.next_read = None
        if isinstance(reply, Error):
            raise self._error(reply.code, reply.message)
        if not isinstance(reply, expect):
            raise self._error(ErrorCode.MALFORMED, f"expected {expect.__name__}, got {type(reply).__name__}")
        return reply

    async def ping(self) -> float:
        """Round trip in ms."""
        began = time.perf_counter()
        nonce = next(_nonces)
        pong = await self.request(Ping(nonce), Pong)
        if pong.nonce != nonce:
            raise self._error(ErrorCode.MALFORMED, "pong for another ping")
        return 1000 * (time.perf_counter() - began)

    async def open(
        self,
        session_id: str,
        model_id: str,
        start: int,
        end: int,
        max_length: int,
        batch_size: int,
        dtype: torch.dtype,
        upstream: str = "",
        kv_from: tuple[str, ...] = (),
        kv_to: tuple[KvTarget, ...] = (),
        prompt_length: int = 0,
        wait: bool = True,
    ) -> None:
        """Opens a session; `upstream` is the peer allowed to push steps into it (peer/push.py);
        `kv_from` the prefill peers whose keys and values it takes (of `prompt_length` tokens),
        `kv_to` where a prefill session sends its own (swarm/wire/protocol.py). `wait` False
        sends the OPEN and returns: the first step follows it without a round trip between, and
        the OPEN's answer is read before that step's (a refusal fails the step)."""
        dtype_name = DTYPE_NAMES[dtype]
        message = Open(
            session_id,
            model_id,
            start,
            end,
            max_length,
            batch_size,
            dtype_name,
            upstream,
            kv_from,
            kv_to,
            prompt_length,
        )
        await self.send(message)
        if wait:
            await self._opened(message, self.timeout)
        else:
            self.opening = asyncio.ensure_future(self._opened(message, self.timeout))

    async def _opened(self, message: Open, timeout: float) -> None:
        """Reads the OPEN's answer and takes what it says: the key the peer signs with, and the
        session's commitment log."""
        opened, m = await self._frame(Opened, timeout), message
        if opened.owner_marker:
            self._take_key(opened.owner_marker)
            if opened.format not in TOLERANCES:  # its signed statements name it: a known one
                raise self._error(ErrorCode.MALFORMED, f"computes in an unknown format {opened.format!r}")
        if m.kv_from and not m.prompt_length:
            return  # it starts where its pushed prompt ends, which the client did not say
        about = SessionId(m.model_id, self.own_id, m.session_id, m.start, m.end, opened.format)
        self.logs[m.session_id] = CommitmentLog(about, first=m.prompt_length if m.kv_from else 0)

    def _take_key(self, owner_marker: bytes) -> None:
        """The public key the peer says it signs with must be the one its peer id is made of."""
        try:
            signer = peer_id_from_owner_marker(owner_marker).to_base58()
        except Exception:
            signer = ""
        if signer != self.peer_id:
            raise self._error(ErrorCode.MALFORMED, "sent a public key that is not its identity's")
        self.owner_marker = owner_marker

    async def step(self, session_id: str, position: int, hidden: torch.Tensor) -> torch.Tensor:
        await self.send(Step(session_id, position, hidden))
        return (await self.step_result(session_id, hidden, position)).hidden

    async def step_result(
        self, session_id: str, hidden: torch.Tensor, position: int | None = None
    ) -> StepResult:
        """The result of a step at `position` (None: where the last one ended) whose input was
        `hidden` (sent by us, or pushed by the previous peer), checked: its output, and why its
        push to the next hop failed ("" if it did not) or that its outcome is still to come
        (`push_pending`)."""
        result = await self.receive(StepResult)
        out = result.hidden
        if out.shape != hidden.shape or out.dtype != hidden.dtype:
            raise self._error(
                ErrorCode.BAD_TENSOR,
                f"returned {tuple(out.shape)} {out.dtype} for input {tuple(hidden.shape)} {hidden.dtype}",
            )
        if result.session_id != session_id:
            raise self._error(ErrorCode.MALFORMED, f"result for session {result.session_id!r}")
        if not torch.isfinite(out).all():
            raise self._error(ErrorCode.BAD_TENSOR, "returned hidden states with NaN or inf")
        if result.kv_error:
            raise KvTransferError(f"{self.peer_name}: {result.kv_error}")
        self._commit(session_id, result, hidden, out, position)
        return result

    def _commit(
        self,
        session_id: str,
        result: StepResult,
        hidden: torch.Tensor,
        out: torch.Tensor,
        position: int | None,
    ) -> None:
        """Checks the step's commitment: it must name the input the client has for it (a pushed
        hop that computed on anything else was sent something else by the previous peer, or says
        so falsely; either way the client stops building on that link), and a signed statement
        must sign the session's steps as the client saw them."""
        input_digest = tensor_digest(hidden)
        if result.digest and result.digest != input_digest:
            raise CommitmentMismatch(
                self.peer_name,
                ErrorCode.BAD_STATE,
                "computed on an input other than the previous hop's output the client got",
                peer_id=self.peer_id,
            )
        log = self.logs.get(session_id)
        if log is None:
            return
        log.add(hidden.shape[1], input_digest, tensor_digest(out), start=position)
        if result.signature:
            self._take_signature(log, log.position, result.signature)

    def _take_signature(self, log: CommitmentLog, position: int, signature: bytes) -> Signed:
        if position != log.position or not verify_signature(
            self.owner_marker, log.session, position, log.chain, signature
        ):
            raise self._error(ErrorCode.BAD_STATE, "signed commitments other than the steps the client saw")
        signed = Signed(position, log.chain, signature)
        log.signed.append(signed)
        return signed

    async def attest(self, session_id: str) -> Signed:
        """The peer's signed statement of the session's steps so far (PeerError if it will not)."""
        attested = await self.request(Attest(session_id), Attested)
        log = self.logs.get(session_id)
        if log is None or not self.owner_marker:
            raise self._error(ErrorCode.BAD_STATE, "this peer signs no commitments")
        return self._take_signature(log, attested.position, attested.signature)

    async def close_session(self, session_id: str) -> None:
        await self.request(Close(session_id), Closed)

    def close(self) -> None:
        for task in (self.next_read, self.outcome, self.opening):
            if task is not None:
                task.cancel()
        self.writer.close()


CLOSE_TIMEOUT_S = 5.0


def random_session_id() -> str:
    """A remote session's id: 128 random bits, so nobody who has not been told it can guess it
    (a peer scopes sessions by their opener too, peer/core.py)."""
    return secrets.token_hex(16)


async def close_sessions(opened: list[tuple[PeerConnection, str]]) -> None:
    """Closes each (connection, session id) pair's session, all at once, each within
    CLOSE_TIMEOUT_S; then ends every stream, even when cancelled: a peer frees the sessions of
    a stream that ended, so no session outlives its client's close whatever the peers answer."""
    try:
        await asyncio.gather(*(_close_one(conn, session_id) for conn, session_id in opened))
    finally:
        for conn, _ in opened:
            conn.close()


async def _close_one(conn: PeerConnection, session_id: str) -> None:
    if conn.writer.is_closing():  # a failed hop's stream is closed already
        return
    try:
        await asyncio.wait_for(conn.close_session(session_id), CLOSE_TIMEOUT_S)
    except Exception as e:  # best effort: the stream's end frees the session anyway
        logger.debug("closing session %s on %s: %s", session_id, conn.peer_name, e)
