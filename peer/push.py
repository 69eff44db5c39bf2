"""Push between peers: a peer sends its output straight to the next peer of the chain.

Relaying through the client costs two network hops per peer (client -> A -> client -> B ...);
pushing costs one (client -> A -> B -> ... -> client), so a step of an n-hop chain crosses
n + 1 links instead of 2n.

How a pushed step flows (swarm/protocol.py has the frames):

1. The client sends STEP to the first hop with `chain` = the next hops (peer id, session id)
   and `ack_ms`.
2. Each peer computes, then pushes its output as a STEP to chain[0] over its link to that peer
   (`PushLinks`: one hivemind stream per next peer, shared by all sessions, pushes matched to
   their PUSH_ACK by session id), with chain[1:].
3. The next peer checks the push (the session exists and names the pushing peer as its
   `upstream`, then the usual step checks) and answers PUSH_ACK at once; it computes later.
4. Only then does the pushing peer send its own STEP_RESULT to the client, with `push_error`
   set if the push failed (no link, refused, no ack within `ack_ms`). So the client learns
   every hop's output (its failover history needs them) and whether the next hop has the
   step: if not, it relays the step to that hop itself (client/session.py).

Who may push into a session: only the peer id the session's client named as `upstream` in its
OPEN, over the client's own stream. libp2p authenticates the remote peer id of every stream
(its secure channel), so a stranger cannot push into someone else's session; a wrong pusher
and an unknown session get the same refusal, so a stranger cannot probe for session ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from swarm.protocol import Error, ErrorCode, ProtocolError, PushAck, Step, read_frame, write_frame

logger = logging.getLogger(__name__)

# Opens a stream to a peer (base58 id): (reader, writer). Injected, so this module needs no p2p.
Connect = Callable[[str], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]

MAX_LINKS = 32  # open links to next peers; the least recently opened one is closed beyond this
MAX_ACK_FRAME = 64 << 10  # a link carries only PUSH_ACK (and ERROR) frames back


class PushLinks:
    """A peer's outgoing links to next peers of its sessions' chains (on the peer's event loop)."""

    def __init__(self, connect: Connect, max_links: int = MAX_LINKS):
        self.connect, self.max_links = connect, max_links
        self.links: dict[str, _Link] = {}
        self.locks: dict[str, asyncio.Lock] = {}  # one connect at a time per peer

    async def push(self, peer_id: str, step: Step, timeout: float) -> str:
        """Sends `step` to `peer_id` and waits up to `timeout` s for its PUSH_ACK.
        Returns "" when it was accepted, else why not. Never raises: a failed push only
        means the client relays this hop."""
        name = peer_id[-8:]
        try:
            ack = await asyncio.wait_for(self._push(peer_id, step), timeout)
        except TimeoutError:
            return f"no PUSH_ACK from ...{name} within {timeout:.2f} s"
        except Exception as e:  # no link, or it broke: the next push opens a new one
            self._drop(peer_id)
            return f"push to ...{name} failed: {type(e).__name__}: {e}"
        if ack.code:
            code = ErrorCode(ack.code).name if ack.code in ErrorCode._value2member_map_ else ack.code
            return f"...{name} refused the push: {code}: {ack.message[:200]}"
        return ""

    async def _push(self, peer_id: str, step: Step) -> PushAck:
        link = await self._link(peer_id)
        return await link.send(step)

    async def _link(self, peer_id: str) -> _Link:
        lock = self.locks.setdefault(peer_id, asyncio.Lock())
        async with lock:
            link = self.links.get(peer_id)
            if link is not None and not link.closed:
                return link
            reader, writer = await self.connect(peer_id)
            while len(self.links) >= self.max_links:
                self._drop(next(iter(self.links)))
            link = self.links[peer_id] = _Link(reader, writer, peer_id[-8:])
            return link

    def _drop(self, peer_id: str) -> None:
        link = self.links.pop(peer_id, None)
        self.locks.pop(peer_id, None)
        if link is not None:
            link.close()

    def close(self) -> None:
        for peer_id in list(self.links):
            self._drop(peer_id)


class _Link:
    """One stream to one next peer; several sessions' pushes may wait on it at once."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str):
        self.reader, self.writer, self.name = reader, writer, name
        self.pending: dict[str, asyncio.Future] = {}  # session id -> its PUSH_ACK
        self.closed = False
        self.task = asyncio.create_task(self._read_acks(), name=f"push-link-{name}")

    async def send(self, step: Step) -> PushAck:
        if step.session_id in self.pending:  # a session has one step at a time
            raise RuntimeError(f"a push of session {step.session_id} is already waiting")
        future = asyncio.get_running_loop().create_future()
        self.pending[step.session_id] = future
        try:
            await write_frame(self.writer, step)
            return await future
        finally:
            self.pending.pop(step.session_id, None)

    async def _read_acks(self) -> None:
        reason: Exception = ConnectionError(f"link to ...{self.name} closed")
        try:
            while True:
                message = await read_frame(self.reader, MAX_ACK_FRAME)
                if isinstance(message, PushAck):
                    future = self.pending.get(message.session_id)
                    if future is not None and not future.done():
                        future.set_result(message)
                elif isinstance(
                    message, Error
                ):  # refused the stream or a frame it could not tie to a session
                    reason = ConnectionError(
                        f"...{self.name} answered {message.code.name}: {message.message}"
                    )
                    break
                else:
                    reason = ConnectionError(f"...{self.name} sent {type(message).__name__} on a push link")
                    break
        except (ConnectionError, asyncio.IncompleteReadError, OSError, ProtocolError) as e:
            reason = ConnectionError(f"link to ...{self.name}: {type(e).__name__}: {e}")
        except asyncio.CancelledError:
            pass
        except Exception:  # never silently: this task's errors are nobody else's
            logger.exception("push link to ...%s failed", self.name)
        finally:
            self.closed = True
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(reason)
            with contextlib.suppress(Exception):
                self.writer.close()

    def close(self) -> None:
        self.closed = True
        self.task.cancel()
