"""A running peer: load blocks, measure them, announce, serve, and leave cleanly.

Lifecycle: JOINING (record up, loading) -> ONLINE (serving) -> LEAVING (on SIGINT/SIGTERM:
refuse new sessions, let open ones finish for up to `drain_timeout`, then exit).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from dataclasses import dataclass

import torch

import swarm
from peer.announcer import Announcer
from peer.blocks import BlockStack
from peer.core import PeerCore, PeerLimits
from peer.server import PeerServer
from peer.throughput import measure_or_load
from swarm.dht import start_dht
from swarm.identity import load_or_create_identity
from swarm.model_spec import ModelSpec
from swarm.protocol import DTYPE_NAMES, SESSION_PROTOCOL
from swarm.records import PeerRecord, PeerState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeerConfig:
    spec: ModelSpec
    start: int
    end: int
    initial_peers: tuple[str, ...]
    host_maddrs: tuple[str, ...]
    announce_maddrs: tuple[str, ...]
    identity_path: str | None
    device: torch.device
    dtype: torch.dtype
    limits: PeerLimits
    name: str | None = None
    announce_period: float = 15.0
    drain_timeout: float = 30.0
    max_frame_bytes: int = 64 << 20
    max_streams: int = 64
    throughput: float | None = None  # announce this instead of the measured prefill tokens/s per block
    decode_ms: float | None = None  # announce this instead of the measured decode ms per block


async def serve(config: PeerConfig) -> int:
    """Runs the peer until SIGINT/SIGTERM; returns the exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    identity = load_or_create_identity(config.identity_path)
    # In the main thread (a second or two of blocking): it sets up signal dispositions for the DHT child.
    dht = start_dht(config.initial_peers, identity, config.host_maddrs, config.announce_maddrs)
    name = config.name or f"{socket.gethostname()}-{identity.peer_id.to_base58()[-6:]}"
    logger.info("peer %s joined the DHT as %s", name, identity.peer_id)
    peer = _Peer(config, dht, identity, name)
    try:
        await peer.announcer.announce(PeerState.JOINING)
        if not await peer.start_serving(stop):
            return 0
        await peer.run_until(stop)
        await peer.leave()
    finally:
        await peer.close()
    return 0


class _Peer:
    """The parts of a running peer, and the steps of its lifecycle."""

    def __init__(self, config: PeerConfig, dht, identity, name: str):
        self.config, self.dht, self.identity, self.name = config, dht, identity, name
        self.core: PeerCore | None = None
        self.throughput = (0.0, 0.0)
        self.p2p = None
        self.addrs = tuple(str(a) for a in dht.get_visible_maddrs())
        self.announcer = Announcer(
            dht, identity, self._record, config.spec.num_blocks, config.announce_period
        )

    def _record(self, state: PeerState) -> PeerRecord:
        c = self.config
        return PeerRecord(
            peer_id=self.identity.peer_id.to_base58(),
            name=self.name,
            model_id=c.spec.model_id,
            start=c.start,
            end=c.end,
            state=state,
            throughput=self.throughput[0],
            decode_ms_per_block=self.throughput[1],
            cache_tokens_left=self.core.cache_tokens_left if self.core else 0,
            open_sessions=len(self.core.sessions) if self.core else 0,
            max_length=c.limits.max_length,
            dtype=DTYPE_NAMES.get(c.dtype, str(c.dtype)),
            device=str(c.device),
            version=swarm.__version__,
            addrs=self.addrs,
        )

    async def start_serving(self, stop: asyncio.Event) -> bool:
        c = self.config
        blocks = await asyncio.to_thread(BlockStack.load, c.spec, c.start, c.end, c.dtype, c.device)
        if c.throughput is not None and c.decode_ms is not None:
            self.throughput = (c.throughput, c.decode_ms)
        else:
            figures = await asyncio.to_thread(measure_or_load, blocks)
            self.throughput = (
                c.throughput or figures.tokens_per_s,
                c.decode_ms or figures.decode_ms_per_block,
            )
        logger.info(
            "throughput %.0f tokens/s per block (prefill), %.2f ms per block (decode)", *self.throughput
        )
        if stop.is_set():
            return False
        self.core = PeerCore(blocks, c.spec.model_id, c.limits)
        server = PeerServer(self.core, c.max_frame_bytes, c.max_streams)
        self.p2p = await self.dht.replicate_p2p()
        await self.p2p.add_binary_stream_handler(SESSION_PROTOCOL, server.handle_stream)
        await self.announcer.announce(PeerState.ONLINE)
        logger.info("online: serving %s blocks [%d:%d)", c.spec.model_id, c.start, c.end)
        return True

    async def run_until(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.config.announce_period)
            except TimeoutError:
                self.core.expire_idle()
                await self.announcer.announce(PeerState.ONLINE)

    async def leave(self) -> None:
        """Refuses new sessions, lets open ones finish, and tells the swarm it is gone."""
        self.core.leaving = True
        logger.info("leaving: refusing new sessions, %d open", len(self.core.sessions))
        await self.announcer.announce(PeerState.LEAVING, ttl=self.config.announce_period)
        deadline = time.monotonic() + self.config.drain_timeout
        while self.core.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if self.core.sessions:
            logger.info("drain timeout: dropping %d open sessions", len(self.core.sessions))

    async def close(self) -> None:
        if self.p2p is not None:
            try:
                await self.p2p.remove_binary_stream_handler(SESSION_PROTOCOL)
                await self.p2p.shutdown()
            except Exception as e:
                logger.debug("p2p shutdown: %s", e)
        await asyncio.wait_for(asyncio.to_thread(self.dht.shutdown), 15)
        logger.info("stopped")
