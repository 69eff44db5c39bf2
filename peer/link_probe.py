"""Round trips to a sample of this peer's own model swarm, smoothed, for the coordinator's view.

Why through the p2p layer, and never to an announced address: a record's `addrs` are written
by the peer that signed it, so they can name any host:port. A probe that opened a TCP
connection to them every period (as the first version did) let one volunteer turn every
honest peer into a port scanner aimed wherever it liked. A probe here is a PING frame on a
session stream (swarm/wire/protocol.py) opened to the record's peer id: libp2p finds that peer by
its id and authenticates it, so the probe reaches that peer or nobody.

Each step (once per announce period):

1. Keep the records of this peer's model (`peer_records_from` has already checked their
   signatures, model id and ranges) that are ONLINE or JOINING, other than this peer's own.
2. Take up to `sample` of them: half from its chain neighbours (peers a step may be pushed to or
   from: whose range holds the block after this peer's, or ends where this peer's starts), the
   rest from the others; in each, unmeasured peers first, then a random pick. Clients price a
   pushed chain by these links (routing/chains/peer_links.py), so they are measured first.
3. Open a stream to each, at once, and time PING -> PONG `PINGS_PER_PROBE` times; the least is
   the round trip (the first may still pay for the stream's setup). The whole probe of one peer
   has PROBE_TIMEOUT_S; a peer that fails it keeps its last measurement.
4. Fold each round trip into an exponentially weighted mean.

The record publishes the neighbours' round trips first, then the nearest others', each under
its peer's link tag (swarm/trust/records.py `link_tag`), to a tenth of a millisecond.

Bandwidth is not measured (too costly to probe), so the coordinator uses the cluster format's
default for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Sequence

from hexswarm.peer.push import Connect
from hexswarm.swarm.trust.records import PeerRecord, PeerState, link_tag
from hexswarm.swarm.wire.frames import read_frame, write_frame
from hexswarm.swarm.wire.protocol import Error, Ping, Pong

logger = logging.getLogger(__name__)

SMOOTHING = 0.3  # weight of a new measurement
PROBE_TIMEOUT_S = 2.0  # for one peer: opening the stream and all its pings
PINGS_PER_PROBE = 2
MAX_PONG_FRAME = 1024  # a PONG (or an ERROR refusing the stream) is a few dozen bytes
DEFAULT_SAMPLE = 4  # peers probed per step: the cost of a period stays the same in any swarm
MAX_PUBLISHED = 32
PROBED_STATES = (PeerState.ONLINE, PeerState.JOINING)


class LinkProbe:
    """This peer's smoothed round trips (ms) to others of its model swarm.

    `connect` opens a session stream to a peer id through the p2p layer (the same one push
    links use); it is injected, so this module needs no p2p and tests can count its calls."""

    def __init__(self, peer_id: str, connect: Connect, sample: int = DEFAULT_SAMPLE, seed: int | None = None):
        if sample < 1:
            raise ValueError(f"sample must be at least 1, got {sample}")
        self.peer_id, self.connect, self.sample = peer_id, connect, sample
        self.rng = random.Random(seed)
        self.rtt_ms: dict[str, float] = {}
        self.neighbours: set[str] = set()

    async def step(self, records: Sequence[PeerRecord], serves: tuple[int, int] | None = None) -> None:
        """Probes up to `sample` peers of `records` (its chain neighbours first, for a peer that
        `serves` blocks [start, end)) and folds in what they answered."""
        live = [r for r in records if r.peer_id != self.peer_id and r.state in PROBED_STATES]
        self.neighbours = {r.peer_id for r in live if serves is not None and _adjacent(r, serves)}
        others = list(dict.fromkeys(r.peer_id for r in live if r.peer_id not in self.neighbours))
        self.rtt_ms = {p: ms for p, ms in self.rtt_ms.items() if p in self.neighbours or p in others}
        near = self._pick(sorted(self.neighbours), (self.sample + 1) // 2)
        chosen = near + self._pick(others, self.sample - len(near))
        results = await asyncio.gather(*(self._measure(p) for p in chosen))
        for peer_id, ms in zip(chosen, results, strict=True):
            if ms is not None:
                old = self.rtt_ms.get(peer_id)
                self.rtt_ms[peer_id] = ms if old is None else (1 - SMOOTHING) * old + SMOOTHING * ms

    def _pick(self, peers: list[str], count: int) -> list[str]:
        """Up to `count` of `peers`: unmeasured ones first, then a random pick."""
        peers = list(peers)
        self.rng.shuffle(peers)
        peers.sort(key=lambda p: p in self.rtt_ms)
        return peers[:count]

    def published(self) -> tuple[tuple[str, float], ...]:
        """Round trips for this peer's record (its `links`): its chain neighbours', then the nearest others'."""
        order = sorted(self.rtt_ms.items(), key=lambda item: (item[0] not in self.neighbours, item[1]))
        return tuple((link_tag(peer), round(ms, 1)) for peer, ms in order[:MAX_PUBLISHED])

    async def _measure(self, peer_id: str) -> float | None:
        """The least PING -> PONG time (ms) to `peer_id`, or None when it did not answer in time."""
        try:
            return await asyncio.wait_for(self._ping(peer_id), PROBE_TIMEOUT_S)
        except TimeoutError:
            logger.debug("no PONG from ...%s within %.1f s", peer_id[-8:], PROBE_TIMEOUT_S)
        except Exception as e:  # whatever the p2p layer raises for a peer it cannot reach
            logger.debug("probe of ...%s failed: %s: %s", peer_id[-8:], type(e).__name__, e)
        return None

    async def _ping(self, peer_id: str) -> float:
        reader, writer = await self.connect(peer_id)
        try:
            times = [
                await _round_trip(reader, writer, self.rng.getrandbits(62)) for _ in range(PINGS_PER_PROBE)
            ]
        finally:
            with contextlib.suppress(Exception):
                writer.close()
        return min(times)


def _adjacent(record: PeerRecord, serves: tuple[int, int]) -> bool:
    """Whether a chain may push from a peer serving `serves` to `record`'s peer or back: its
    range holds the block right after, or it can end a hop where `serves` starts."""
    start, end = serves
    return record.start <= end < record.end or record.ends_a_hop_at(start)


async def _round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, nonce: int) -> float:
    """One PING on an open session stream; its round trip in ms."""
    began = time.perf_counter()
    await write_frame(writer, Ping(nonce))
    answer = await read_frame(reader, MAX_PONG_FRAME)
    ms = (time.perf_counter() - began) * 1000.0
    if isinstance(answer, Error):
        raise ConnectionError(f"refused: {answer.code.name}: {answer.message[:200]}")
    if not isinstance(answer, Pong) or answer.nonce != nonce:
        raise ConnectionError(f"expected PONG {nonce}, got {type(answer).__name__}")
    return ms
