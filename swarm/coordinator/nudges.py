"""Telling auto peers that a new plan is out, so that they need not poll the DHT for it.

hivemind's DHT has no subscriptions. Until this, every `--layers auto` peer read the lease and
plan keys once a second to follow a new plan within a second: at 300 peers ~600 searches a
second on the few nodes nearest those two keys, for plans that change a few times an hour
(docs/architecture.md, "The control plane's costs").

Now the coordinator that publishes plan v tells each auto peer of the swarm, over one short p2p
stream (`NUDGE_PROTOCOL`), "plan v of model m is out"; the peer then reads the lease and plan
from the DHT, as it did every second before, and follows what it reads there. A nudge carries
no plan, so a forged or replayed one can at worst cost its receiver one read:

- only a coordinator the peer trusts may nudge it (libp2p authenticates the stream's remote
  peer id; in a private swarm, which trusts any member, any member may);
- a nudge names the model and a version newer than the one followed, else it is dropped;
- reads follow each other at least NUDGE_READ_GAP_S apart however many nudges come, and at
  most MAX_OPEN_NUDGES streams are read at once, each for at most NUDGE_TIMEOUT_S.

A nudge that is lost (a peer behind a relay that is down, a dial that timed out) costs only
time: every auto peer still reads the plan every 4th announce period (peer/plan_follower.py `step`).

Cost: one stream to each auto peer per new plan version (at most NUDGE_CONCURRENCY dials at a
time), instead of two DHT searches per auto peer a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import msgpack

from hexswarm.swarm.coordinator.records import MAX_PLAN_VERSION, Trust
from hexswarm.swarm.wire.frames import framed, read_payload

logger = logging.getLogger(__name__)

NUDGE_PROTOCOL = "/hexswarm/plan-nudge/1"
MAX_NUDGE_BYTES = 512  # a model id and a version
NUDGE_TIMEOUT_S = 3.0  # a dial, the nudge and its answer
NUDGE_CONCURRENCY = 16  # the coordinator's dials at once
MAX_OPEN_NUDGES = 8  # nudge streams a peer reads at once (more are closed unread)
NUDGE_READ_GAP_S = 1.0  # the shortest time between two plan reads that nudges cause
RECEIVED = b"\x01"


@dataclass(frozen=True)
class Nudge:
    model_id: str
    version: int

    def to_bytes(self) -> bytes:
        return msgpack.packb({"model": self.model_id, "version": self.version})

    @classmethod
    def from_bytes(cls, data: bytes) -> Nudge:
        """ValueError on anything but {"model": str, "version": int in 1..MAX_PLAN_VERSION}."""
        try:
            body = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except Exception as e:
            raise ValueError(f"not msgpack: {type(e).__name__}") from None
        if not isinstance(body, dict) or set(body) != {"model", "version"}:
            raise ValueError("a nudge is a map of exactly model and version")
        model, version = body["model"], body["version"]
        if not isinstance(model, str) or not model:
            raise ValueError("the model is not a name")
        if type(version) is not int or not 0 < version <= MAX_PLAN_VERSION:
            raise ValueError(f"version {version!r} is out of range")
        return cls(model, version)


async def send_nudges(
    open_stream: Callable[[str, str], Awaitable[tuple]], peer_ids: Iterable[str], nudge: Nudge
) -> int:
    """Sends `nudge` to each of `peer_ids` over `open_stream(peer_id, protocol)` (reader, writer);
    how many said they received it."""
    gate = asyncio.Semaphore(NUDGE_CONCURRENCY)

    async def one(peer_id: str) -> bool:
        async with gate:
            try:
                return await asyncio.wait_for(_send_one(open_stream, peer_id, nudge), NUDGE_TIMEOUT_S)
            except Exception as e:  # the peer's record lives on; its next period's read catches up
                logger.debug("nudging ...%s: %s: %s", peer_id[-8:], type(e).__name__, e)
                return False

    return sum(await asyncio.gather(*(one(peer_id) for peer_id in peer_ids)))


async def _send_one(open_stream, peer_id: str, nudge: Nudge) -> bool:
    reader, writer = await open_stream(peer_id, NUDGE_PROTOCOL)
    try:
        writer.write(framed(nudge.to_bytes()))
        await writer.drain()
        return await reader.readexactly(len(RECEIVED)) == RECEIVED
    finally:
        writer.close()


class NudgeInbox:
    """An auto peer's side: `handle_stream` takes nudges, `arrived` is set by one that counts
    (from a trusted coordinator, for this model, newer than `followed()`)."""

    def __init__(self, model_id: str, trust: Trust, followed: Callable[[], int]):
        self.model_id, self.trust, self.followed = model_id, trust, followed
        self.arrived = asyncio.Event()
        self.open = 0
        self.last_read = -float("inf")

    def take_local(self, nudge: Nudge) -> None:
        """A nudge from the coordinator candidate in this peer's own process (it cannot dial itself)."""
        self._take(nudge)

    async def handle_stream(
        self, stream_info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        remote = str(getattr(stream_info, "peer_id", ""))
        try:
            if self.open >= MAX_OPEN_NUDGES or (self.trust is not None and remote not in self.trust):
                return  # closed unread: a stranger's nudge is not worth a read
            self.open += 1
            try:
                payload = await asyncio.wait_for(read_payload(reader, MAX_NUDGE_BYTES), NUDGE_TIMEOUT_S)
                self._take(Nudge.from_bytes(payload))
                writer.write(RECEIVED)
                await writer.drain()
            finally:
                self.open -= 1
        except Exception as e:  # remote input: dropped, logged quietly
            logger.debug("a nudge from ...%s: %s: %s", remote[-8:], type(e).__name__, e)
        finally:
            writer.close()

    def _take(self, nudge: Nudge) -> None:
        if nudge.model_id == self.model_id and nudge.version > self.followed():
            self.arrived.set()

    async def wait(self, stop: asyncio.Event) -> bool:
        """Waits for a nudge that counts, no sooner than NUDGE_READ_GAP_S after the last one
        taken; False if `stop` came first."""
        gap = self.last_read + NUDGE_READ_GAP_S - time.monotonic()
        if gap > 0 and await _set_within(stop, gap):
            return False
        arrived = asyncio.ensure_future(self.arrived.wait())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({arrived, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            arrived.cancel()
            stopped.cancel()
        if stop.is_set():
            return False
        self.arrived.clear()
        self.last_read = time.monotonic()
        return True


async def _set_within(event: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), seconds)
        return True
    except TimeoutError:
        return False
