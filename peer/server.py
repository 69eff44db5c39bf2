"""The peer's transport: one hivemind binary stream per client session hop.

Frames on a stream are handled one at a time, in order. Validation runs on the event loop;
the layer computation runs on one compute thread (peer/scheduler.py, which batches decode
steps of all streams), so a slow step never blocks other streams' frames (they queue for
compute, they are not refused). Any bad frame gets an error
frame back; only an oversized frame (whose bytes we refuse to read) ends the stream.

A step may also arrive pushed by the previous peer of the chain, on that peer's link stream
(peer/push.py): it is answered with a PUSH_ACK on the link at once, computed in a task of its
own (so the link's next push, another session's, is not held up and can join the same decode
batch), and its result goes to the session's client, on the stream that opened the session.
A step marked `early` is answered before its own push is acked, and the push's outcome follows
(`_answer_then_push`); a session's next answer never overtakes that outcome.

Disaggregated prefill and decode: a prefill session's step sends each of its layers' keys and
values (KV_PUSH) to the decode sessions its OPEN named, over the same links, before the step is
answered; a decode session takes them, on a link, only from the peers its OPEN named.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from hexswarm.peer.admission import Admission, AdmissionLimits
from hexswarm.peer.core import PeerCore, session_key
from hexswarm.peer.faults import FaultInjector
from hexswarm.peer.hop_stats import HopStats
from hexswarm.peer.push import PushLinks
from hexswarm.peer.scheduler import BatchPolicy, Job, StepScheduler
from hexswarm.swarm.wire.commitments import SIGN_EVERY, SessionId, next_chain, statement, tensor_digest
from hexswarm.swarm.wire.frames import FrameBudget, decode, read_payload, write_frame
from hexswarm.swarm.wire.protocol import (
    Attest,
    Attested,
    Close,
    Error,
    ErrorCode,
    KvPush,
    Message,
    Open,
    Ping,
    Pong,
    ProtocolError,
    PushAck,
    Step,
    StepResult,
)

logger = logging.getLogger(__name__)

# A stream that has opened no session (and is no push link) is closed this many seconds after
# it was opened, whatever it sends meanwhile: PINGs alone cannot hold a stream slot.
HANDSHAKE_TIMEOUT_S = 30.0
# ... and its frames may be this large at most: OPEN, PING and CLOSE are a few hundred bytes.
# Hidden states come only on a stream that owns a session, or from a session's upstream peer.
PRE_SESSION_FRAME_BYTES = 64 << 10
KV_PUSH_TIMEOUT_S = 30.0  # one KV_PUSH to its decode peer, until its PUSH_ACK
KV_PUSH_BYTES = 16 << 20  # keys and values of as many layers as fit go in one KV_PUSH


class PeerServer:
    """Serves PeerCore over hivemind streams."""

    def __init__(
        self,
        core: PeerCore,
        max_frame_bytes: int,
        max_streams: int,
        policy: BatchPolicy | None = None,
        admission: Admission | None = None,
        handshake_timeout: float = HANDSHAKE_TIMEOUT_S,
        max_buffered_bytes: int | None = None,
    ):
        self.core = core
        self.handshake_timeout = handshake_timeout
        self.admission = admission or Admission(AdmissionLimits())
        self.max_frame_bytes = max_frame_bytes
        # frames held at once over all streams; over it, a frame is refused from its length prefix
        self.frames = FrameBudget(max(max_frame_bytes, max_buffered_bytes or 16 * max_frame_bytes))
        self.max_streams = max_streams
        self.open_streams = 0
        # Streams that have opened no session yet, oldest first: the first to go when slots run out.
        self.waiting: dict[asyncio.StreamWriter, None] = {}
        self.scheduler = StepScheduler(core, policy or BatchPolicy())
        # prompt compute is shared fairly by IP group (identities cost nothing), else by remote
        self.scheduler.account_of = lambda session: self.admission.groups.get(session.owner) or session.owner
        self.hop_stats = HopStats()
        self.faults: FaultInjector | None = None  # debug fault injection (peer/faults.py); tests only
        self.pusher: PushLinks | None = None  # links to next peers (set once the p2p handle is up)
        self.clients: dict[str, asyncio.StreamWriter] = {}  # session id -> the stream that opened it
        self.tasks: set[asyncio.Task] = set()  # pushed steps being computed
        self.outcomes: dict[str, asyncio.Future] = {}  # session key -> its early answer's push, until told
        # The peer's identity (swarm/net/identity.py): signs its sessions' commitments; None signs nothing.
        self.signer = None
        self.format = ""  # the format it computes in, named in what it signs: none set, nothing signed
        self.banned: set[str] = set()  # peers proven to lie (peer/evidence_service.py): refused
        self.group_of = None  # async: remote peer id -> its IP group, None on loopback (set by the runtime)

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.scheduler.stop()

    async def handle_stream(
        self, stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote_id = str(getattr(stream_info, "peer_id", "?"))
        remote = remote_id[-8:]
        try:
            if remote_id in self.banned:
                raise ProtocolError(ErrorCode.BANNED, "this peer proved you signed a wrong output")
            group = await self.group_of(remote_id) if self.group_of is not None else None
            self.admission.enter_stream(remote_id, group, self.max_streams)
        except ProtocolError as e:
            await self._send(writer, Error(e.code, e.message))
            writer.close()
            return
        if self.open_streams >= self.max_streams and not self._evict_a_waiting_stream():
            self.admission.leave_stream(remote_id)
            await self._send(writer, Error(ErrorCode.BUSY, f"all {self.max_streams} stream slots are taken"))
            writer.close()
            return
        self.open_streams += 1
        owned: set[str] = set()  # sessions opened on this stream; freed when it ends
        try:
            await self._serve(reader, writer, owned, remote_id)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            logger.exception("stream from ...%s failed", remote)
        finally:
            for session_id in owned:
                key = session_key(remote_id, session_id)
                self.core.drop(key)
                self.clients.pop(key, None)
            self.open_streams -= 1
            self.waiting.pop(writer, None)
            self.admission.leave_stream(remote_id)
            writer.close()

    def _evict_a_waiting_stream(self) -> bool:
        """Closes the longest-waiting stream that has no session yet, so a newcomer gets its slot:
        identities are free to make, so streams without a session must not be able to hold
        every slot between them (each one still lives at most the handshake timeout)."""
        if not self.waiting:
            return False
        oldest = next(iter(self.waiting))
        del self.waiting[oldest]
        oldest.close()  # its read ends, and its own handler frees the slot
        return True

    async def _serve(self, reader, writer, owned: set[str], remote: str = "?") -> None:
        is_link = False  # a previous peer's push link: it owns no session but must stay open
        handshake_ends = time.monotonic() + self.handshake_timeout
        while True:
            in_session = owned or is_link
            if in_session:
                self.waiting.pop(writer, None)  # it holds its slot for its sessions now
                # and should they all close, it gets a fresh window to open another
                handshake_ends = time.monotonic() + self.handshake_timeout
            else:
                self.waiting.setdefault(writer, None)  # new, or its sessions all closed: evictable
            timeout = (
                self.core.limits.session_idle_timeout if in_session else handshake_ends - time.monotonic()
            )
            limit = (
                self.max_frame_bytes
                if in_session or self._feeds_a_session(remote)
                else PRE_SESSION_FRAME_BYTES
            )
            try:
                payload = await asyncio.wait_for(
                    read_payload(reader, min(limit, self.max_frame_bytes), self.frames), timeout
                )
            except TimeoutError:
                return
            except ProtocolError as e:  # over the frame size or the peer's frame budget
                await self._send(writer, Error(e.code, e.message))
                return  # the refused payload is still in the stream: it cannot be resynchronized
            try:
                is_link = await self._handle_frame(payload, owned, writer, remote) or is_link
            finally:
                self.frames.release(len(payload))

    async def _handle_frame(self, payload: bytes, owned: set[str], writer, remote: str) -> bool:
        """One frame of a stream: decoded, checked and answered (or taken as a push); whether
        it made the stream a push link."""
        arrived = time.perf_counter()
        try:
            message = decode(payload)
            if isinstance(message, Step) and message.ack_ms and message.session_id not in owned:
                # Only a push that was taken earns a link the long timeout, not a stranger's.
                return await self._pushed(message, remote, writer, arrived)
            if isinstance(message, Step):
                await self._step(message, owned, writer, arrived, remote)
                return False
            if isinstance(message, KvPush):
                return await self._kv_pushed(message, remote, writer)
            reply = await self._dispatch(message, owned, remote, writer)
        except ProtocolError as e:
            reply = Error(e.code, e.message)
        except Exception as e:
            logger.exception("internal error on a frame")
            reply = Error(ErrorCode.INTERNAL, f"{type(e).__name__}: {e}")
        await self._send(writer, reply)
        return False

    async def _step(self, message: Step, owned: set[str], writer, arrived: float, remote: str) -> None:
        """A client's step: queued for the compute thread; its result (after any push) goes back."""
        self._check_owned(message.session_id, owned)
        session, hidden, poison = self._begin_step(message, remote)
        await self._run(session, hidden, poison, message, writer, arrived)

    def _begin_step(self, message: Step, owner: str):
        """The checks every step passes, a client's or a pushed one: the session's rate limit,
        then the core's shape, position and value checks; and whether a debug fault poisons it."""
        self.admission.check_step(session_key(owner, message.session_id))
        session, hidden = self.core.begin_step(message, owner)
        poison = self.faults is not None and self.faults.before_step(session)
        return session, hidden, poison

    async def _run(self, session, hidden, poison: bool, message: Step, writer, arrived: float) -> None:
        """Computes a validated step, pushes its output down the chain if asked, answers `writer`."""
        job = self.scheduler.submit(session, hidden)
        queued = min(time.perf_counter(), job.compute_started or float("inf"))
        result: StepResult = await asyncio.wrap_future(job.future)
        if poison:
            result = self.faults.poison(result)
        result = self._commit(session, message.hidden, result)
        if session.kv_to:
            result = replace(result, kv_error=await self._send_kv(session))
        if (told := self.outcomes.get(session.key)) is not None:
            await asyncio.shield(told)  # a step's answer never overtakes the last one's push outcome
        if message.chain and not result.kv_error and message.early:
            answered = await self._answer_then_push(session.key, result, message, session.owner, writer)
        else:
            if message.chain and not result.kv_error:
                result = replace(result, push_error=await self._forward(result, message, session.owner))
            await self._send(writer, result)
            answered = time.perf_counter()
        self._note(job, arrived, queued, answered)

    async def _answer_then_push(
        self, key: str, result: StepResult, message: Step, owner: str, writer
    ) -> float:
        """An early answer (Step.early): the output goes to the client now, then the push, whose
        outcome follows on the client's stream as a PUSH_ACK; the next step's answer waits for it.
        Returns when the answer was sent."""
        outcome = self.outcomes[key] = asyncio.get_running_loop().create_future()
        try:
            await self._send(writer, replace(result, push_pending=True))
            answered = time.perf_counter()
            why = await self._forward(result, message, owner)
            await self._send(writer, PushAck(message.session_id, ErrorCode.PUSH_FAILED if why else 0, why))
            return answered
        finally:
            outcome.set_result(None)
            if self.outcomes.get(key) is outcome:
                del self.outcomes[key]

    def _commit(self, session, hidden, result: StepResult) -> StepResult:
        """Folds the step into the session's commitments; signs them every SIGN_EVERY steps."""
        input_digest = tensor_digest(hidden)
        session.chain = next_chain(
            session.chain, session.position, input_digest, tensor_digest(result.hidden)
        )
        session.steps += 1
        signature = self._sign(session) if session.steps % SIGN_EVERY == 0 else b""
        return replace(result, digest=input_digest, signature=signature)

    @property
    def signs(self) -> bool:
        """Whether it signs its sessions' commitments: an identity, and the format they name."""
        return self.signer is not None and bool(self.format)

    def _sign(self, session) -> bytes:
        if not self.signs:
            return b""
        core = self.core
        about = SessionId(
            core.model_id, session.owner, session.session_id, session.start, session.end, self.format
        )
        return self.signer.private_key.sign(statement(about, session.position, session.chain))

    async def _forward(self, result: StepResult, message: Step, owner: str) -> str:
        """Pushes this hop's output to the next hop of the chain (a session of the same client,
        `owner`); "" when it took it, else why not."""
        if self.pusher is None:
            return "this peer does not push"
        head, rest = message.chain[0], message.chain[1:]
        hidden = result.hidden
        if self.faults is not None and self.faults.equivocates:
            hidden = self.faults.other_output(hidden)
        step = Step(head.session_id, message.position, hidden, rest, message.ack_ms, owner, message.early)
        return await self.pusher.push(head.peer_id, step, message.ack_ms / 1000)

    async def _send_kv(self, session) -> str:
        """Sends each layer's keys and values of a prefill session to its decode session, in order;
        "" when every one was taken, else why not (the client then serves the request colocated)."""
        if self.pusher is None:
            return "this peer does not push"
        began, sent = time.perf_counter(), 0
        per_push = max(1, KV_PUSH_BYTES // max(self.core.kv_bytes_per_layer(session), 1))
        for target in session.kv_to:
            for first in range(target.start, target.end, per_push):
                layers = range(first, min(first + per_push, target.end))
                keys, values = self.core.export_kv(session, layers)
                if self.faults is not None and self.faults.poisons_kv:
                    keys, values = self.faults.poisoned_kv(keys, values)
                push = KvPush(target.session_id, first, keys, values, session.owner)
                why = await self.pusher.push(target.peer_id, push, KV_PUSH_TIMEOUT_S)
                if why:
                    return f"keys and values of layers [{layers[0]}:{layers[-1] + 1}): {why}"
                sent += keys.nbytes + values.nbytes
        ms, s = 1000 * (time.perf_counter() - began), session
        logger.info(
            "session %s: sent %d tokens of keys and values, %d bytes, to %d decode session(s) in %.0f ms",
            s.session_id, s.position, sent, len(s.kv_to), ms,
        )  # fmt: skip
        return ""

    async def _kv_pushed(self, message: KvPush, remote: str, link) -> bool:
        """A prefill peer's keys and values for a decode session: taken (or refused) on its link.
        Returns whether it was taken."""
        try:
            if self.faults is not None and self.faults.plan.push == "refuse":
                self.faults.check_push()
            self.core.import_kv(message, remote)
        except ProtocolError as e:
            await self._send(link, PushAck(message.session_id, e.code, e.message))
            return False
        await self._send(link, PushAck(message.session_id))
        return True

    async def _pushed(self, message: Step, remote: str, link, arrived: float) -> bool:
        """A step pushed by the previous peer: acked (or refused) on its link, computed in a task.
        Returns whether it was taken."""
        try:
            client, session, hidden, poison = self._accept_push(message, remote)
        except ProtocolError as e:
            if not (self.faults is not None and self.faults.drops_pushes):
                await self._send(link, PushAck(message.session_id, e.code, e.message))
            return False
        await self._send(link, PushAck(message.session_id))
        task = asyncio.create_task(self._run_pushed(session, hidden, poison, message, client, arrived))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    def _accept_push(self, message: Step, remote: str):
        """The checks on a pushed step: the session must name `remote` as its upstream."""
        if self.faults is not None:
            self.faults.check_push()
        key = session_key(message.owner, message.session_id)
        session, client = self.core.sessions.get(key), self.clients.get(key)
        if session is None or client is None or not session.upstream or session.upstream != remote:
            # The same answer whether the session is unknown or not the pusher's to feed.
            raise ProtocolError(
                ErrorCode.UNKNOWN_SESSION, f"no session {message.session_id!r} takes pushes from this peer"
            )
        return (client, *self._begin_step(message, message.owner))

    async def _run_pushed(self, session, hidden, poison: bool, message: Step, client, arrived: float) -> None:
        try:
            await self._run(session, hidden, poison, message, client, arrived)
        except ProtocolError as e:  # the client hears about it as if it had sent the step itself
            await self._send(client, Error(e.code, e.message))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.exception("internal error on a pushed step")
            await self._send(client, Error(ErrorCode.INTERNAL, f"{type(e).__name__}: {e}"))

    def _note(self, job: Job, arrived: float, queued: float, sent: float) -> None:
        self.hop_stats.add(
            **{
                "in": queued - arrived,
                "queue": job.compute_started - queued - job.window_s,
                "window": job.window_s,
                "compute": job.compute_ended - job.compute_started,
                "out": sent - job.compute_ended,
            }
        )

    async def _dispatch(self, message: Message, owned: set[str], remote: str = "?", writer=None) -> Message:
        match message:
            case Ping():
                return Pong(message.nonce)
            case Open():
                self.core.check_open(
                    message, remote
                )  # a malformed OPEN is told so before any share is counted
                needed, limits = message.batch_size * message.max_length, self.core.limits
                self.admission.check_open(
                    remote,
                    self.core.sessions,
                    needed,
                    limits.cache_tokens,
                    limits.session_cache_tokens or 0,
                    limits.max_sessions,
                )
                opened = self.core.open(message, remote)
                if self.signs:
                    opened = replace(opened, owner_marker=self.signer.owner_marker, format=self.format)
                key = session_key(remote, message.session_id)
                self.admission.opened(remote, key)
                owned.add(message.session_id)
                self.clients[key] = writer
                return opened
            case Attest():
                self._check_owned(message.session_id, owned)
                session = self.core.get(message.session_id, remote)
                if not self.signs or session.busy:
                    raise ProtocolError(ErrorCode.BAD_STATE, "this peer signs no commitments now")
                return Attested(message.session_id, session.position, self._sign(session))
            case Close():
                self._check_owned(message.session_id, owned)
                owned.discard(message.session_id)
                self.clients.pop(session_key(remote, message.session_id), None)
                return self.core.close(message, remote)
            case _:
                raise ProtocolError(
                    ErrorCode.BAD_STATE, f"a peer does not accept {type(message).__name__} frames"
                )

    def _feeds_a_session(self, remote: str) -> bool:
        """Whether `remote` is the upstream of an open session: its push link's first frame
        carries hidden states before the link owns anything."""
        return any(
            session.upstream == remote or remote in session.kv_from for session in self.core.sessions.values()
        )

    @staticmethod
    def _check_owned(session_id: str, owned: set[str]) -> None:
        # Sessions are bound to the stream that opened them, so nobody can step or close another's.
        if session_id not in owned:
            raise ProtocolError(
                ErrorCode.UNKNOWN_SESSION, f"no session {session_id!r} is open on this stream"
            )

    @staticmethod
    async def _send(writer, message: Message) -> None:
        try:
            await write_frame(writer, message)
        except (ConnectionError, RuntimeError):
            pass  # the client went away; its sessions are freed by handle_stream
