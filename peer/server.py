"""The peer's transport: one hivemind binary stream per client session hop.

Frames on a stream are handled one at a time, in order. Validation runs on the event loop;
the layer computation runs on one compute thread, so a slow step never blocks other
streams' frames (they queue for compute, they are not refused). Any bad frame gets an error
frame back; only an oversized frame (whose bytes we refuse to read) ends the stream.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from peer.admission import Admission, AdmissionLimits
from peer.core import PeerCore
from swarm.protocol import (
    Close,
    Error,
    ErrorCode,
    FrameTooLarge,
    Message,
    Open,
    Ping,
    Pong,
    ProtocolError,
    Step,
    decode,
    read_payload,
    write_frame,
)

logger = logging.getLogger(__name__)

# A stream that has opened no session yet must say something within this many seconds.
HANDSHAKE_TIMEOUT_S = 30.0


class PeerServer:
    """Serves PeerCore over hivemind streams."""

    def __init__(
        self, core: PeerCore, max_frame_bytes: int, max_streams: int, admission: Admission | None = None
    ):
        self.core = core
        self.admission = admission or Admission(AdmissionLimits())
        self.max_frame_bytes = max_frame_bytes
        self.max_streams = max_streams
        self.open_streams = 0
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compute")

    async def handle_stream(
        self, stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote_id = str(getattr(stream_info, "peer_id", "?"))
        remote = remote_id[-8:]
        try:
            if self.open_streams >= self.max_streams:
                raise ProtocolError(ErrorCode.BUSY, f"all {self.max_streams} stream slots are taken")
            self.admission.enter_stream(remote_id)
        except ProtocolError as e:
            await self._send(writer, Error(e.code, e.message))
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
                self.core.drop(session_id)
            self.open_streams -= 1
            self.admission.leave_stream(remote_id)
            writer.close()

    async def _serve(self, reader, writer, owned: set[str], remote: str = "?") -> None:
        while True:
            timeout = self.core.limits.session_idle_timeout if owned else HANDSHAKE_TIMEOUT_S
            try:
                payload = await asyncio.wait_for(read_payload(reader, self.max_frame_bytes), timeout)
            except TimeoutError:
                return
            except FrameTooLarge as e:
                await self._send(writer, Error(e.code, e.message))
                return  # the oversized payload is still in the stream: it cannot be resynchronized
            try:
                reply = await self._dispatch(decode(payload), owned, remote)
            except ProtocolError as e:
                reply = Error(e.code, e.message)
            except Exception as e:
                logger.exception("internal error on a frame")
                reply = Error(ErrorCode.INTERNAL, f"{type(e).__name__}: {e}")
            await self._send(writer, reply)

    async def _dispatch(self, message: Message, owned: set[str], remote: str = "?") -> Message:
        match message:
            case Ping():
                return Pong(message.nonce)
            case Open():
                self.admission.check_open(remote, self.core.sessions)
                opened = self.core.open(message)
                self.admission.opened(remote, message.session_id)
                owned.add(message.session_id)
                return opened
            case Step():
                self._check_owned(message.session_id, owned)
                self.admission.check_step(message.session_id)
                session, hidden = self.core.begin_step(message)
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self.compute, self.core.run_step, session, hidden)
            case Close():
                self._check_owned(message.session_id, owned)
                owned.discard(message.session_id)
                return self.core.close(message)
            case _:
                raise ProtocolError(
                    ErrorCode.BAD_STATE, f"a peer does not accept {type(message).__name__} frames"
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
