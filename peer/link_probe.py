"""Round trips to a sample of other peers, smoothed, for the coordinator's view of the network.

Each step times a TCP handshake to the first announced address of up to `sample` peers (the
others are taken in turn over later steps) and folds it into an exponentially weighted mean.
A TCP connect is one round trip and costs the other side nothing but an accept; bandwidth is
not measured (too costly to probe), so the coordinator uses the cluster format's default.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence

from swarm.records import PeerRecord

SMOOTHING = 0.3  # weight of a new measurement
CONNECT_TIMEOUT_S = 2.0
MAX_PUBLISHED = 32


def tcp_endpoint(maddr: str) -> tuple[str, int] | None:
    """('1.2.3.4', 31337) from '/ip4/1.2.3.4/tcp/31337/p2p/...'; None for other transports."""
    parts = maddr.split("/")
    try:
        i = parts.index("tcp")
        if parts[1] not in ("ip4", "ip6", "dns", "dns4", "dns6"):
            return None
        return parts[2], int(parts[i + 1])
    except (ValueError, IndexError):
        return None


class LinkProbe:
    """This peer's smoothed round trips (ms) to others."""

    def __init__(self, peer_id: str, sample: int = 4, seed: int | None = None):
        self.peer_id, self.sample = peer_id, sample
        self.rng = random.Random(seed)
        self.rtt_ms: dict[str, float] = {}

    async def step(self, records: Sequence[PeerRecord]) -> None:
        others = [r for r in records if r.peer_id != self.peer_id and r.addrs]
        live = {r.peer_id for r in others}
        self.rtt_ms = {p: ms for p, ms in self.rtt_ms.items() if p in live}
        # Unmeasured peers first, then a random sample of the rest.
        self.rng.shuffle(others)
        others.sort(key=lambda r: r.peer_id in self.rtt_ms)
        results = await asyncio.gather(*(self._measure(r) for r in others[: self.sample]))
        for record, ms in zip(others, results, strict=False):
            if ms is not None:
                old = self.rtt_ms.get(record.peer_id)
                self.rtt_ms[record.peer_id] = ms if old is None else (1 - SMOOTHING) * old + SMOOTHING * ms

    def published(self) -> tuple[tuple[str, float], ...]:
        nearest = sorted(self.rtt_ms.items(), key=lambda item: item[1])[:MAX_PUBLISHED]
        return tuple((peer, round(ms, 3)) for peer, ms in nearest)

    @staticmethod
    async def _measure(record: PeerRecord) -> float | None:
        endpoint = next((e for e in map(tcp_endpoint, record.addrs) if e is not None), None)
        if endpoint is None:
            return None
        began = time.perf_counter()
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(*endpoint), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            return None
        ms = (time.perf_counter() - began) * 1000.0
        writer.close()
        return ms
