"""A running peer: load blocks, measure them, announce, serve, and leave cleanly.

Lifecycle: JOINING (record up, loading) -> ONLINE (serving) -> LEAVING (on SIGINT/SIGTERM:
refuse new sessions, let open ones finish for up to `drain_timeout`, then exit).

With `--tp K` the blocks are a tensor-parallel group (peer/tp_group.py): this process is rank
0 and starts the others. If a rank dies or hangs, the peer announces LEAVING, answers its open
sessions with PEER_FAILED for up to FAILURE_GRACE_S, stops the group and exits with status 1.
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
from peer.admission import Admission, AdmissionLimits
from peer.announcer import Announcer
from peer.blocks import BlockStack
from peer.core import Blocks, PeerCore, PeerLimits
from peer.debug import CorruptOutputs
from peer.devices import describe
from peer.server import PeerServer
from peer.throughput import measure_or_load
from peer.tp_group import TPGroup, TPGroupError
from swarm.dht import start_dht
from swarm.dht_process import shutdown_dht
from swarm.identity import load_or_create_identity
from swarm.model_spec import ModelSpec
from swarm.protocol import DTYPE_NAMES, SESSION_PROTOCOL, ProtocolError
from swarm.records import PeerRecord, PeerState

logger = logging.getLogger(__name__)

# After a rank failure, how long open sessions get to hear PEER_FAILED on their next frame.
FAILURE_GRACE_S = 5.0
# The exit after the last session is gone is budgeted so that a peer with no open sessions
# exits within ~5 s of SIGTERM even when the DHT is unreachable: the "leaving" record gets
# LEAVE_ANNOUNCE_S (it is best effort: the record expires on its own anyway), the p2p handle
# P2P_CLOSE_S and the DHT process DHT_CLOSE_S (then it is killed, p2pd with it).
LEAVE_ANNOUNCE_S = 1.5
P2P_CLOSE_S = 0.5
DHT_CLOSE_S = 2.5


@dataclass(frozen=True)
class PeerConfig:
    spec: ModelSpec
    start: int
    end: int
    initial_peers: tuple[str, ...]
    host_maddrs: tuple[str, ...]
    announce_maddrs: tuple[str, ...]
    identity_path: str | None
    devices: tuple[torch.device, ...]  # one per tensor-parallel rank; rank 0 (this process) first
    dtype: torch.dtype
    limits: PeerLimits
    name: str | None = None
    announce_period: float = 15.0
    drain_timeout: float = 30.0
    max_frame_bytes: int = 64 << 20
    max_streams: int = 64
    throughput: float | None = None  # announce this instead of the measured prefill tokens/s per block
    decode_ms: float | None = None  # announce this instead of the measured decode ms per block
    tp_timeout: float = 30.0  # bound on every collective and on a rank's silence (seconds)
    admission: AdmissionLimits = AdmissionLimits()  # per-remote and per-session limits
    debug_corrupt_outputs: bool = False  # tests only: add noise to every output (peer/debug.py)

    @property
    def tp(self) -> int:
        return len(self.devices)


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
    peer = _Peer(config, dht, identity, name, stop)
    try:
        await peer.announcer.announce(PeerState.JOINING)
        if not await peer.start_serving(stop):
            return 0
        await peer.run_until(stop)
        if peer.core.failure is not None:
            await peer.leave_after_failure()
            return 1
        await peer.leave()
    except TPGroupError as e:
        logger.error("the tensor-parallel group failed: %s", e)
        await peer.announcer.announce(PeerState.LEAVING, ttl=config.announce_period, timeout=LEAVE_ANNOUNCE_S)
        return 1
    finally:
        await peer.close()
    return 0


class _Peer:
    """The parts of a running peer, and the steps of its lifecycle."""

    def __init__(self, config: PeerConfig, dht, identity, name: str, stop: asyncio.Event):
        self.config, self.dht, self.identity, self.name = config, dht, identity, name
        self.stop = stop
        self.loop = asyncio.get_running_loop()
        self.core: PeerCore | None = None
        self.group: TPGroup | None = None
        self.device_info = ()
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
            device=",".join(str(d) for d in c.devices),
            version=swarm.__version__,
            addrs=self.addrs,
            tp=c.tp,
            devices=self.device_info,
        )

    async def start_serving(self, stop: asyncio.Event) -> bool:
        c = self.config
        blocks = await self._load_blocks()
        if c.throughput is not None and c.decode_ms is not None:
            self.throughput = (c.throughput, c.decode_ms)
        else:
            try:  # through every rank of a group, collectives included
                figures = await asyncio.to_thread(measure_or_load, blocks)
            except ProtocolError as e:
                raise TPGroupError(e.message) from None
            self.throughput = (
                c.throughput or figures.tokens_per_s,
                c.decode_ms or figures.decode_ms_per_block,
            )
        logger.info(
            "throughput %.0f tokens/s per block (prefill), %.2f ms per block (decode)", *self.throughput
        )
        if stop.is_set():
            return False
        if c.debug_corrupt_outputs:
            logger.warning("--debug-corrupt-outputs: every output of this peer is WRONG on purpose")
            blocks = CorruptOutputs(blocks)
        self.core = PeerCore(blocks, c.spec.model_id, c.limits)
        server = PeerServer(self.core, c.max_frame_bytes, c.max_streams, Admission(c.admission))
        self.p2p = await self.dht.replicate_p2p()
        await self.p2p.add_binary_stream_handler(SESSION_PROTOCOL, server.handle_stream)
        await self.announcer.announce(PeerState.ONLINE)
        logger.info("online: serving %s blocks [%d:%d)", c.spec.model_id, c.start, c.end)
        return True

    async def _load_blocks(self) -> Blocks:
        c = self.config
        if c.tp == 1:
            device = c.devices[0]
            threads = torch.get_num_threads() if device.type == "cpu" else None
            self.device_info = (describe(device, threads),)
            return await asyncio.to_thread(BlockStack.load, c.spec, c.start, c.end, c.dtype, device)
        self.group = TPGroup(c.spec, c.start, c.end, c.dtype, c.devices, c.tp_timeout, self._on_group_failure)
        blocks = await asyncio.to_thread(self.group.launch)
        self.device_info = self.group.device_info
        return blocks

    def _on_group_failure(self, reason: str) -> None:
        """Called from the group's watcher thread: fail the sessions and leave, on the event loop."""

        def fail() -> None:
            if self.core is not None:
                self.core.fail(reason)
            self.stop.set()

        self.loop.call_soon_threadsafe(fail)

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
        await self.announcer.announce(
            PeerState.LEAVING, ttl=self.config.announce_period, timeout=LEAVE_ANNOUNCE_S
        )
        deadline = time.monotonic() + self.config.drain_timeout
        while self.core.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if self.core.sessions:
            logger.info("drain timeout: dropping %d open sessions", len(self.core.sessions))

    async def leave_after_failure(self) -> None:
        """Part of the group is gone: tell the swarm, and let open sessions hear PEER_FAILED."""
        logger.error("leaving after a failure: %s", self.core.failure)
        await self.announcer.announce(
            PeerState.LEAVING, ttl=self.config.announce_period, timeout=LEAVE_ANNOUNCE_S
        )
        deadline = time.monotonic() + min(FAILURE_GRACE_S, self.config.drain_timeout)
        while self.core.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        if self.group is not None:
            await asyncio.to_thread(self.group.stop)
        if self.p2p is not None:
            try:
                await asyncio.wait_for(self._close_p2p(), P2P_CLOSE_S)
            except Exception as e:
                logger.debug("p2p shutdown: %s", type(e).__name__)
        await asyncio.to_thread(shutdown_dht, self.dht, DHT_CLOSE_S)
        logger.info("stopped")

    async def _close_p2p(self) -> None:
        await self.p2p.remove_binary_stream_handler(SESSION_PROTOCOL)
        await self.p2p.shutdown()
