"""Push between peers: a peer sends its output straight to the next peer of the chain.

Relaying through the client costs two network hops per peer (client -> A -> client -> B ...);
pushing costs one (client -> A -> B -> ... -> client), so a step of an n-hop chain crosses
n + 1 links instead of 2n.

How a pushed step flows (swarm/wire/protocol.py has the frames):

1. The client sends STEP to the first hop with `chain` = the next hops (peer id, session id)
   and `ack_ms`.
2. Each peer computes, then pushes its output as a STEP to chain[0] over its link to that peer
   (`PushLinks`: one hivemind stream per next peer, shared by all sessions, pushes matched to
   their PUSH_ACK by session id), with chain[1:].
3. The next peer checks the push (the session exists and names the pushing peer as its
   `upstream`, then the usual step checks) and answers PUSH_ACK at once; it computes later.
4. The pushing peer sends its own STEP_RESULT to the client. A client's step marked `early`
   (what clients send) is answered at once, with `push_pending`, and the push's outcome follows
   as a PUSH_ACK on the client's stream (code 0, or PUSH_FAILED and why: no link, refused, no
   ack within `ack_ms`); else the answer waits for the ack and carries `push_error`. So the
   client learns every hop's output (its failover history needs them) and whether the next hop
   has the step: if not, it relays the step to that hop itself (client/session.py). With early
   answers the ack's round trip is off the token's path: the last hop's output reaches the
   client after k + 1 crossings for a chain of k peers, not 2k.

Who may push into a session: only the peer id the session's client named as `upstream` in its
OPEN, over the client's own stream. libp2p authenticates the remote peer id of every stream
(its secure channel), so a stranger cannot push into someone else's session; a wrong pusher
and an unknown session get the same refusal, so a stranger cannot probe for session ids.

Whom a peer pushes to: the chain is written by a client nobody vouches for, so a peer dials
only peers that announce its own model in the DHT (`SwarmMembers`, refreshed from the records
the peer reads every announce period). Any other id gets a push_error without a dial: a
client cannot make the swarm connect to peers of its choosing.

A link that fails (no PUSH_ACK in time, an error, a broken stream) is closed and dropped at
once: the pushes still waiting on it fail now instead of at their own deadlines, and the next
push opens a fresh link. So that a dead peer is not re-dialed on every step, a peer whose link
failed is not dialed again for RETRY_AFTER_S, doubling with each failure in a row up to
MAX_RETRY_AFTER_S (`Backoff`); meanwhile pushes to it fail at once and the client relays.

A push's deadline is its client's `ack_ms`, though, and a link is shared by every client's
sessions. A deadline shorter than LINK_FAILURE_AFTER_S says more about that client's patience
than about the link (ack_ms = 1 times out on a healthy one), so such a push fails alone: if it
closed the link and backed the peer off, one client could cut the pushes of all the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable

from hexswarm.swarm.wire.frames import read_frame, write_frame
from hexswarm.swarm.wire.protocol import Error, ErrorCode, KvPush, ProtocolError, PushAck, Step

logger = logging.getLogger(__name__)

# Opens a stream to a peer (base58 id): (reader, writer). Injected, so this module needs no p2p.
Connect = Callable[[str], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
# Reads the peer ids that announce this peer's model now in the DHT record shard of the peer id
# it is given (swarm/trust/record_keys.py: one key, not the model's 32); has its own deadline.
ReadMembers = Callable[[str], Awaitable[Iterable[str]]]

MAX_LINKS = 32  # open links to next peers; the least recently opened one is closed beyond this
MAX_ACK_FRAME = 64 << 10  # a link carries only PUSH_ACK (and ERROR) frames back
# A peer stays a member this long after its record was last seen: one failed or partial DHT read
# must not stop pushes, and a record that lapsed (its TTL is a few announce periods) still ends.
MEMBER_TTL_S = 120.0
REFRESH_AFTER_S = 1.0  # an id not known re-reads the records at most this often (a client picks ids)
MAX_MEMBERS = 4096
RETRY_AFTER_S = 1.0  # after a link to a peer failed, how long before it is dialed again ...
MAX_RETRY_AFTER_S = 30.0  # ... doubling with each failure in a row, up to this
MAX_BACKOFFS = 1024  # peers remembered as failing; the oldest is forgotten beyond this
# A push that timed out fails its link (closed, the peer backed off) only if it waited this
# long: a client's default push deadline (client/retry.py), far above an ACK's round trip.
LINK_FAILURE_AFTER_S = 1.0


class NotAMemberError(Exception):
    """The next hop does not announce this peer's model: it is not dialed."""


class BackingOffError(Exception):
    """The next hop's link failed a moment ago: it is not dialed again yet."""


class PushInFlightError(Exception):
    """A push of the same next-hop session already waits on the link: the client named one
    session in two chains. Only this push fails; the link is fine."""


class SwarmMembers:
    """The peer ids that announce this peer's model in the DHT: the only ones it pushes to.

    `update` is fed the ids of every read of the records (once per announce period). An id not
    known (a peer that joined since) re-reads its record shard through `read`, at most every
    `refresh_after_s`, so a client naming random ids costs at most one DHT read per interval
    (a second, when a push's deadline leaves time for it, finds a record one read missed)."""

    def __init__(
        self,
        read: ReadMembers,
        ttl_s: float = MEMBER_TTL_S,
        refresh_after_s: float = REFRESH_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.read, self.ttl_s, self.refresh_after_s, self.clock = read, ttl_s, refresh_after_s, clock
        self.seen: dict[str, float] = {}  # peer id -> when its record was last read (oldest first)
        self.read_at = -math.inf
        self.lock = asyncio.Lock()  # one re-read at a time; the others wait for its answer

    def update(self, peer_ids: Iterable[str]) -> None:
        now = self.clock()
        for peer_id in peer_ids:
            self.seen.pop(peer_id, None)
            self.seen[peer_id] = now
        while self.seen and (
            len(self.seen) > MAX_MEMBERS or next(iter(self.seen.values())) < now - self.ttl_s
        ):
            self.seen.pop(next(iter(self.seen)))

    def knows(self, peer_id: str) -> bool:
        seen = self.seen.get(peer_id)
        return seen is not None and seen >= self.clock() - self.ttl_s

    async def check(self, peer_id: str, wait_s: float = 0.0) -> None:
        """Returns if `peer_id` announces this model; raises NotAMemberError if not.

        An id not known re-reads the records if a read is due; if it is still not known and the
        next read is due within `wait_s`, it waits for that one read more: a record that entered
        the DHT a moment ago may be missing from one read (a replica that has not stored it yet)."""
        give_up_at = self.clock() + wait_s
        for _ in range(2):  # the read due now, and at most one more
            if self.knows(peer_id):
                return
            due_in = self.read_at + self.refresh_after_s - self.clock()
            if due_in > 0:
                if self.clock() + due_in > give_up_at:
                    break
                await asyncio.sleep(due_in)
            async with self.lock:  # one re-read at a time; the others wait for its answer
                if not self.knows(peer_id) and self.clock() - self.read_at >= self.refresh_after_s:
                    self.read_at = self.clock()  # before the read: a failing DHT is not asked again at once
                    self.update(await self.read(peer_id))
        if not self.knows(peer_id):
            raise NotAMemberError(f"...{peer_id[-8:]} does not announce this model in the DHT: not dialed")


class Backoff:
    """When each peer whose link failed may be dialed again (bounded; cleared by a success)."""

    def __init__(
        self,
        first_s: float = RETRY_AFTER_S,
        max_s: float = MAX_RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.first_s, self.max_s, self.clock = first_s, max_s, clock
        self.failing: dict[str, tuple[int, float]] = {}  # peer id -> (failures in a row, retry at)

    def failed(self, peer_id: str) -> None:
        failures, retry_at = self.failing.get(peer_id, (0, 0.0))
        if retry_at > self.clock():  # already counted: several pushes saw the same failure
            return
        self.failing.pop(peer_id, None)  # re-inserted last: the dict stays oldest first
        failures += 1
        wait = min(self.max_s, self.first_s * 2 ** (failures - 1))
        self.failing[peer_id] = (failures, self.clock() + wait)
        while len(self.failing) > MAX_BACKOFFS:
            self.failing.pop(next(iter(self.failing)))

    def succeeded(self, peer_id: str) -> None:
        self.failing.pop(peer_id, None)

    def check(self, peer_id: str) -> None:
        """Raises BackingOffError while `peer_id` must not be dialed."""
        failures, retry_at = self.failing.get(peer_id, (0, 0.0))
        left = retry_at - self.clock()
        if left > 0:
            raise BackingOffError(
                f"the link to ...{peer_id[-8:]} failed {failures} time(s) in a row: not dialed for {left:.1f} s"
            )


class PushLinks:
    """A peer's outgoing links to next peers of its sessions' chains (on the peer's event loop).

    `members`: the peers it may push to (None: any, for tests that have no DHT);
    `link_failure_after_s`: the shortest push deadline whose timeout fails the link."""

    def __init__(
        self,
        connect: Connect,
        max_links: int = MAX_LINKS,
        members: SwarmMembers | None = None,
        backoff: Backoff | None = None,
        link_failure_after_s: float = LINK_FAILURE_AFTER_S,
    ):
        self.connect, self.max_links, self.members = connect, max_links, members
        self.backoff = backoff or Backoff()
        self.link_failure_after_s = link_failure_after_s
        self.links: dict[str, _Link] = {}
        self.locks: dict[str, asyncio.Lock] = {}  # one connect at a time per peer

    async def push(self, peer_id: str, step: Step | KvPush, timeout: float) -> str:
        """Sends `step` to `peer_id` and waits up to `timeout` s for its PUSH_ACK (the membership
        check and the connect included). Returns "" when it was accepted, else why not. Never
        raises: a failed push only means the client relays this hop."""
        deadline = asyncio.get_running_loop().time() + timeout
        why = await self._admit(peer_id, timeout)
        return why or await self._deliver(peer_id, step, deadline, timeout)

    async def _admit(self, peer_id: str, timeout: float) -> str:
        """Why `peer_id` may not be dialed, or "" if it may: it must announce this peer's model."""
        if self.members is None:
            return ""
        try:
            # half the deadline at most: the connect and the PUSH_ACK need the rest
            await asyncio.wait_for(self.members.check(peer_id, timeout / 2), timeout)
        except NotAMemberError as e:
            return str(e)
        except TimeoutError:
            return f"could not tell within {timeout:.2f} s whether ...{peer_id[-8:]} announces this model"
        except Exception as e:  # the DHT read failed: not the next peer's fault, so no backoff
            return f"could not read this model's records: {type(e).__name__}: {e}"
        return ""

    async def _deliver(self, peer_id: str, step: Step | KvPush, deadline: float, timeout: float) -> str:
        name, link = peer_id[-8:], None
        try:
            async with asyncio.timeout_at(deadline):
                link = await self._link(peer_id)
                ack = await link.send(step)
        except (BackingOffError, PushInFlightError) as e:
            return str(e)
        except TimeoutError:
            if timeout >= self.link_failure_after_s:
                self._failed(peer_id, link)
            return f"{'no link to' if link is None else 'no PUSH_ACK from'} ...{name} within {timeout:.2f} s"
        except Exception as e:  # no link, or it broke: the next push opens a new one
            self._failed(peer_id, link)
            return f"push to ...{name} failed: {type(e).__name__}: {e}"
        self.backoff.succeeded(peer_id)
        if ack.code:
            code = ErrorCode(ack.code).name if ack.code in ErrorCode._value2member_map_ else ack.code
            return f"...{name} refused the push: {code}: {ack.message[:200]}"
        return ""

    async def _link(self, peer_id: str) -> _Link:
        lock = self.locks.setdefault(peer_id, asyncio.Lock())
        async with lock:
            link = self.links.get(peer_id)
            if link is not None and not link.closed:
                return link
            self.links.pop(peer_id, None)  # closed by the other side while idle
            self.backoff.check(peer_id)  # here too, so pushes that waited on a failed connect fail at once
            reader, writer = await self.connect(peer_id)
            while len(self.links) >= self.max_links:
                self._close(next(iter(self.links)))
            link = self.links[peer_id] = _Link(reader, writer, peer_id[-8:])
            return link

    def _failed(self, peer_id: str, link: _Link | None) -> None:
        """A connect (`link` None) or a link failed: drop that link, not a newer one, and back off."""
        if link is not None and self.links.get(peer_id) is link:
            self._close(peer_id)
        self.backoff.failed(peer_id)
        lock = self.locks.get(peer_id)  # keeps `locks` as small as `links`; a connect's lock stays
        if lock is not None and not lock.locked() and peer_id not in self.links:
            del self.locks[peer_id]

    def _close(self, peer_id: str) -> None:
        link = self.links.pop(peer_id, None)
        if link is not None:
            link.close(ConnectionError(f"link to ...{peer_id[-8:]} closed after a failure"))

    def close(self) -> None:
        for peer_id in list(self.links):
            self._close(peer_id)
        self.locks.clear()


class _Link:
    """One stream to one next peer; several sessions' pushes may wait on it at once."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str):
        self.reader, self.writer, self.name = reader, writer, name
        self.pending: dict[str, asyncio.Future] = {}  # session id -> its PUSH_ACK
        self.closed = False
        self.task = asyncio.create_task(self._read_acks(), name=f"push-link-{name}")

    async def send(self, step: Step | KvPush) -> PushAck:
        if self.closed:
            raise ConnectionError(f"link to ...{self.name} is closed")
        if step.session_id in self.pending:  # a session has one step at a time
            raise PushInFlightError(f"a push of session {step.session_id!r} is already waiting")
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
            self._end(reason)

    def _end(self, reason: Exception) -> None:
        """Marks the link closed and fails every push still waiting on it, now."""
        self.closed = True
        for future in self.pending.values():
            if not future.done():
                future.set_exception(reason)
        with contextlib.suppress(Exception):
            self.writer.close()

    def close(self, reason: Exception | None = None) -> None:
        self._end(reason or ConnectionError(f"link to ...{self.name} closed"))
        self.task.cancel()
