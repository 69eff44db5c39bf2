"""A running edge peer: the same blocks, core and server as run-peer, behind a py-libp2p host.

What differs from peer/runtime.py is only the transport and the announcement: streams come
from peer/edge/host.py instead of hivemind's p2pd, and the signed record goes to a full node
that relays it (swarm/nat/announce_relay.py) instead of into a DHT process of our own. Frames are
validated, batched and computed by peer/server.py and peer/core.py, unchanged.

It pushes outputs to the next peer as run-peer does (peer/push.py), over streams its host opens
by peer id, and only to the peers that announce its model: the relay's answer to each of its
announcements lists them (it cannot read the DHT itself).

Not here (yet): tensor parallelism, quantization, following the coordinator's plan,
disaggregated roles, link probes.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from dataclasses import dataclass

import torch

from hexswarm import swarm
from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import PeerCore, PeerLimits
from hexswarm.peer.edge.host import EdgeHost, load_or_create_key
from hexswarm.peer.push import PushLinks, SwarmMembers
from hexswarm.peer.server import PeerServer
from hexswarm.peer.throughput import measure_or_load
from hexswarm.swarm.models.model_spec import ModelSpec
from hexswarm.swarm.trust.dht_signing import MAX_RELAYED_TTL_S, SignedEntry, owner_marker, signed_value
from hexswarm.swarm.trust.record_keys import IndexSchedule, index_key, record_key
from hexswarm.swarm.trust.records import ModelEntry, PeerRecord, PeerState
from hexswarm.swarm.wire.tensors import DTYPE_NAMES

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EdgeConfig:
    spec: ModelSpec
    start: int
    end: int
    initial_peers: tuple[str, ...]  # full nodes (a bootstrap) that relay its record
    host_maddrs: tuple[str, ...]
    identity_path: str
    name: str
    dtype: torch.dtype
    limits: PeerLimits
    announce_period: float = 15.0
    ttl_periods: float = 2.5  # as peer/announcer.py: a silent peer drops out within this
    drain_timeout: float = 30.0
    max_frame_bytes: int = 64 << 20
    max_streams: int = 64
    throughput: float | None = None  # announce this instead of measuring (tests)
    decode_ms: float | None = None


class _Stamp:
    """Expirations that never go backwards: the DHT keeps the value that expires last."""

    def __init__(self):
        self.last = 0.0

    def next(self, ttl: float) -> float:
        self.last = max(time.time() + ttl, self.last + 1e-3)
        return self.last


async def serve(config: EdgeConfig) -> int:
    """Runs the edge peer until SIGINT/SIGTERM; returns the exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    peer = EdgePeer(config)
    try:
        await peer.start()
        if not stop.is_set():
            await peer.run_until(stop)
            await peer.leave()
    finally:
        peer.close()
    return 0


class EdgePeer:
    """The parts of a running edge peer (core, server, libp2p host) and its lifecycle."""

    def __init__(self, config: EdgeConfig):
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.key_pair, self.signing_key = load_or_create_key(config.identity_path)
        self.marker = owner_marker(self.signing_key.public_key())
        self.stamp = _Stamp()
        self.index = IndexSchedule()  # which announcements carry the models entry
        self.core: PeerCore | None = None
        self.server: PeerServer | None = None
        self.host: EdgeHost | None = None
        self.throughput = (0.0, 0.0)
        self.streams: set[asyncio.Task] = set()
        self.members: tuple[str, ...] = ()  # peer ids announcing this model, as the relay last said

    async def start(self) -> None:
        c = self.config
        blocks = await asyncio.to_thread(
            BlockStack.load, c.spec, c.start, c.end, c.dtype, torch.device("cpu")
        )
        self.throughput = (c.throughput, c.decode_ms)
        if c.throughput is None or c.decode_ms is None:
            figures = await asyncio.to_thread(measure_or_load, blocks)
            self.throughput = (
                c.throughput or figures.tokens_per_s,
                c.decode_ms or figures.decode_ms_per_block,
            )
        self.core = PeerCore(blocks, c.spec.model_id, c.limits)
        self.server = PeerServer(self.core, c.max_frame_bytes, c.max_streams)
        self.server.pusher = PushLinks(self._open_link, members=SwarmMembers(self._member_ids))
        self.host = EdgeHost(self.key_pair, list(c.host_maddrs), list(c.initial_peers), self._on_stream)
        await asyncio.to_thread(self.host.start)
        logger.info("libp2p host %s listening on %s", self.host.peer_id, ", ".join(self.host.addrs))
        await self.announce(PeerState.ONLINE)
        logger.info("online: serving %s blocks [%d:%d) over py-libp2p", c.spec.model_id, c.start, c.end)

    def _on_stream(self, sock: socket.socket, remote: str) -> None:
        """From the host's thread: serve the socket's end of a session stream on this loop."""
        self.loop.call_soon_threadsafe(self._serve_socket, sock, remote)

    def _serve_socket(self, sock: socket.socket, remote: str) -> None:
        task = self.loop.create_task(self._serve_stream(sock, remote))
        self.streams.add(task)
        task.add_done_callback(self.streams.discard)

    async def _serve_stream(self, sock: socket.socket, remote: str) -> None:
        reader, writer = await asyncio.open_connection(sock=sock)
        await self.server.handle_stream(_StreamInfo(remote), reader, writer)

    async def _open_link(self, peer_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A session stream to the next peer of a chain, for pushes (peer/push.py)."""
        sock = await asyncio.to_thread(self.host.open_stream, peer_id)
        return await asyncio.open_connection(sock=sock)

    async def _member_ids(self, peer_id: str) -> tuple[str, ...]:
        return self.members  # refreshed by every announcement; a newcomer waits for the next one

    async def run_until(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.config.announce_period)
            except TimeoutError:
                self.core.expire_idle()
                await self.announce(PeerState.ONLINE)

    async def announce(self, state: PeerState, ttl: float | None = None) -> None:
        """Signs this peer's record (and its models entry when due, as peer/announcer.py stores
        it) and hands them to a relay; a failure is logged, not raised."""
        c = self.config
        expiration = self.stamp.next(c.announce_period * c.ttl_periods if ttl is None else ttl)
        record_id = record_key(c.spec.model_id, self.host.peer_id)
        entries = [self._signed(record_id, self._record(state).to_bytes(), expiration)]
        with_index = self.index.due()
        if with_index:
            lasts = min(
                self.index.expiration(expiration, c.announce_period), time.time() + MAX_RELAYED_TTL_S - 1
            )
            entry = ModelEntry(c.spec.model_id, c.spec.num_blocks).to_bytes()
            entries.append(self._signed(index_key(self.host.peer_id), entry, max(lasts, expiration)))
        try:
            stored, why, members = await asyncio.to_thread(self.host.announce, entries)
        except Exception as e:  # noqa: BLE001 - the host's thread is gone: nothing to announce through
            stored, why, members = 0, f"{type(e).__name__}: {e}", ()
        if members:
            self.members = members
            self.server.pusher.members.update(members)
        if stored and with_index:  # a relay checks a request's entries together, then stores each
            self.index.taken()
        if not stored:
            logger.warning("announcing %s (%s) failed: %s; will retry", c.spec.model_id, state.value, why)

    def _signed(self, key: str, value: bytes, expiration: float) -> SignedEntry:
        return SignedEntry(
            key, self.marker, signed_value(self.signing_key, key, self.marker, value, expiration), expiration
        )

    def _record(self, state: PeerState) -> PeerRecord:
        c = self.config
        return PeerRecord(
            peer_id=self.host.peer_id,
            name=c.name,
            model_id=c.spec.model_id,
            start=c.start,
            end=c.end,
            state=state,
            throughput=self.throughput[0],
            decode_ms_per_block=self.throughput[1],
            decode_batch_tokens_per_s=1000 / self.throughput[1],
            cache_tokens_left=self.core.session_cache_tokens_left,
            open_sessions=len(self.core.sessions),
            max_length=c.limits.max_length,
            dtype=DTYPE_NAMES.get(c.dtype, str(c.dtype)),
            device="cpu",
            version=swarm.__version__,
            addrs=tuple(self.host.addrs),
        )

    async def leave(self) -> None:
        """As run-peer: refuse new sessions, let open ones finish, then say it is gone."""
        self.core.leaving = True
        await self.announce(PeerState.LEAVING, ttl=self.config.announce_period)
        deadline = time.monotonic() + self.config.drain_timeout
        while self.core.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await self.announce(PeerState.GONE, ttl=self.config.announce_period)

    def close(self) -> None:
        for task in self.streams:
            task.cancel()
        if self.server is not None:
            self.server.close()
            self.server.pusher.close()
        if self.host is not None:
            self.host.stop()
        logger.info("stopped")


@dataclass(frozen=True)
class _StreamInfo:
    peer_id: str  # the remote's base58 id, as hivemind's StreamInfo carries it
