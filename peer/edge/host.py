"""The edge peer's libp2p host: py-libp2p on trio, in a thread of its own.

It speaks what hivemind's p2pd speaks (measured, docs/architecture.md "Edge peers"): TCP,
multistream-select 1.0, Noise XX for security and yamux for muxing, with the same RSA identity
file format, so a client's p2pd dials it by peer id (found through the bootstrap's libp2p DHT,
which learns its addresses from the connection it keeps) and opens "/hexswarm/session/1" on it.

Each session stream is bridged to the peer's asyncio server (peer/server.py, unchanged) through
a local socket pair: the server reads and writes real asyncio streams, as it does behind p2pd,
and the bytes are never parsed on this side.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import multiaddr
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from libp2p import new_host
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.pb import crypto_pb2
from libp2p.crypto.serialization import deserialize_private_key
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service.context import background_trio_service

from hexswarm.swarm.trust.dht_signing import (
    ANNOUNCE_PROTOCOL,
    MAX_REPLY_BYTES,
    SignedEntry,
    decode_reply,
    encode_announce,
)
from hexswarm.swarm.wire.checks import ErrorCode, ProtocolError
from hexswarm.swarm.wire.protocol import SESSION_PROTOCOL

logger = logging.getLogger(__name__)

CHUNK = 1 << 16  # bytes per read on either side of the bridge
START_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
ANNOUNCE_TIMEOUT_S = 15.0
DIAL_TIMEOUT_S = 10.0  # to find a next peer through the DHT and open a stream to it
# A DHT lookup asks every peer it meets for the Kademlia protocol, and clients' daemons (DHT
# clients) refuse it: py-libp2p logs each refusal as an ERROR of many lines. They are expected;
# a lookup that fails for good reaches us as an exception, which push.py reports.
QUIET_LOGGERS = ("libp2p.host.basic_host", "libp2p.kad_dht.peer_routing")


def load_or_create_key(path: str | Path) -> tuple[KeyPair, rsa.RSAPrivateKey]:
    """The peer's RSA identity from a libp2p key file (the format of run-peer's --identity),
    created if missing: as py-libp2p's key pair (its host) and as cryptography's (its records)."""
    path = Path(path)
    if not path.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        der = key.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=der).SerializeToString())
        path.chmod(0o600)
    data = path.read_bytes()
    proto = crypto_pb2.PrivateKey.FromString(data)
    if proto.key_type != crypto_pb2.KeyType.RSA:
        raise ValueError(f"{path}: only RSA identities are supported (hivemind's DHT signs with RSA)")
    private = deserialize_private_key(data)
    return KeyPair(private, private.get_public_key()), serialization.load_der_private_key(proto.data, None)


class EdgeHost:
    """A py-libp2p host in a thread. `on_stream(sock, remote_peer_id)` is called (in the host's
    thread) with one end of a socket pair for each session stream a remote opens."""

    def __init__(
        self,
        key_pair: KeyPair,
        listen: list[str],
        initial_peers: list[str],
        on_stream: Callable[[socket.socket, str], None],
    ):
        self.key_pair = key_pair
        self.listen = [multiaddr.Multiaddr(a) for a in listen]
        self.initial_peers = [info_from_p2p_addr(multiaddr.Multiaddr(a)) for a in initial_peers]
        self.on_stream = on_stream
        self.peer_id = ""
        self.addrs: list[str] = []
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="libp2p-host", daemon=True)

    def start(self, timeout: float = START_TIMEOUT_S) -> list[str]:
        """Starts listening and connects to the initial peers; returns the addresses it listens on."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the libp2p host did not start within {timeout} s")
        if self._error is not None:
            raise RuntimeError(f"the libp2p host failed: {self._error}") from self._error
        return self.addrs

    def stop(self, timeout: float = 5.0) -> None:
        if self._token is not None and self._thread.is_alive():
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(timeout)

    def announce(self, entries: list[SignedEntry]) -> tuple[int, str, tuple[str, ...]]:
        """Blocking: hands signed entries to the first initial peer that relays them
        (swarm/nat/announce_relay.py); (nodes that stored them, why not, the model's member peer
        ids) from the last one tried."""
        return trio.from_thread.run(self._announce, entries, trio_token=self._token)

    def open_stream(self, peer_id: str) -> socket.socket:
        """Blocking: a session stream to `peer_id` (a push link, peer/push.py), as one end of a
        socket pair. The peer is found by id through the libp2p DHT of the initial peers'
        daemons, as hivemind's p2pd finds peers."""
        return trio.from_thread.run(self._open_stream, peer_id, trio_token=self._token)

    # ------------------------------------------------------------ the host's thread

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # noqa: BLE001 - reported to start(), or logged once running
            self._error = e
            logger.exception("the libp2p host stopped")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        noise = NoiseTransport(self.key_pair, noise_privkey=new_x25519_key_pair().private_key)
        # Noise and yamux only: what go-libp2p (hivemind's p2pd) speaks too; no fallbacks to offer.
        host = new_host(
            key_pair=self.key_pair,
            sec_opt={NOISE_PROTOCOL_ID: noise},
            muxer_preference="YAMUX",
            listen_addrs=self.listen,
        )
        self._stop = trio.Event()
        self.dht = KadDHT(host, DHTMode.CLIENT)  # to look peers up; it stores nothing
        async with host.run(listen_addrs=self.listen), background_trio_service(self.dht):
            async with trio.open_nursery() as nursery:  # the bridges of the streams it opens
                self.host, self._nursery = host, nursery
                host.set_stream_handler(TProtocol(SESSION_PROTOCOL), self._accept)
                self.peer_id = host.get_id().to_base58()
                self.addrs = [str(a).split("/p2p/")[0] for a in host.get_addrs()]
                await self._connect_initial_peers()
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

    async def _connect_initial_peers(self) -> int:
        """(Re)connects to every initial peer: the connection is how clients' daemons find this
        peer's addresses. Returns how many are connected."""
        connected = 0
        for info in self.initial_peers:
            with trio.move_on_after(CONNECT_TIMEOUT_S):
                try:
                    await self.host.connect(info)
                    await self.dht.routing_table.add_peer(info.peer_id)
                    connected += 1
                except Exception as e:  # noqa: BLE001 - one unreachable bootstrap is not fatal
                    logger.warning("cannot connect to %s: %s", info.peer_id, e)
        return connected

    async def _announce(self, entries: list[SignedEntry]) -> tuple[int, str, tuple[str, ...]]:
        await self._connect_initial_peers()
        why = "no initial peer to relay through"
        for info in self.initial_peers:
            with trio.move_on_after(ANNOUNCE_TIMEOUT_S):
                try:
                    stored, why, members = await self._ask_relay(info.peer_id, entries)
                    if stored:
                        return stored, why, members
                    continue
                except Exception as e:  # noqa: BLE001 - try the next one
                    why = f"{type(e).__name__}: {e}"
                    continue
            why = f"no answer within {ANNOUNCE_TIMEOUT_S} s"
        return 0, why, ()

    async def _ask_relay(self, peer_id, entries: list[SignedEntry]) -> tuple[int, str, tuple[str, ...]]:
        stream = await self.host.new_stream(peer_id, [TProtocol(ANNOUNCE_PROTOCOL)])
        try:
            await stream.write(encode_announce(entries))
            reply = b""
            while len(reply) < 4 or len(reply) < 4 + int.from_bytes(reply[:4], "big"):
                reply += await stream.read(MAX_REPLY_BYTES)  # StreamEOF if the relay hangs up early
                if len(reply) > MAX_REPLY_BYTES:
                    raise ProtocolError(ErrorCode.FRAME_TOO_LARGE, "the relay's reply is too long")
        finally:
            await stream.close()
        return decode_reply(reply[4:])

    async def _open_stream(self, peer_id: str) -> socket.socket:
        target = ID.from_base58(peer_id)
        with trio.fail_after(DIAL_TIMEOUT_S):
            info = await self.dht.find_peer(target)  # the peerstore first, then the network
            if info is None:
                raise ConnectionError(f"peer ...{peer_id[-8:]} was not found in the DHT")
            await self.host.connect(info)
            stream = await self.host.new_stream(target, [TProtocol(SESSION_PROTOCOL)])
        ours, theirs = socket.socketpair()
        self._nursery.start_soon(_bridge, stream, ours)
        return theirs

    async def _accept(self, stream) -> None:
        """A remote opened a session stream: the asyncio server gets the socket pair's other end."""
        ours, theirs = socket.socketpair()
        self.on_stream(theirs, stream.muxed_conn.peer_id.to_base58())
        await _bridge(stream, ours)


async def _bridge(stream, ours: socket.socket) -> None:
    """Pipes one libp2p stream to a socket whose other end the asyncio side reads and writes."""
    sock = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_pipe_in, stream, sock, nursery.cancel_scope)
        nursery.start_soon(_pipe_out, sock, stream, nursery.cancel_scope)
    await sock.aclose()
    try:
        await stream.reset()
    except Exception:  # noqa: BLE001 - already closed by the other side
        pass


async def _pipe_in(stream, sock: trio.SocketStream, scope: trio.CancelScope) -> None:
    """Remote -> server. At the remote's EOF the server sees EOF; on a reset both ends go."""
    try:
        while data := await stream.read(CHUNK):
            await sock.send_all(data)
    except StreamEOF:
        pass
    except Exception:  # noqa: BLE001 - a reset stream or a closed socket ends the bridge
        scope.cancel()
        return
    try:
        await sock.send_eof()
    except Exception:  # noqa: BLE001
        scope.cancel()


async def _pipe_out(sock: trio.SocketStream, stream, scope: trio.CancelScope) -> None:
    """Server -> remote. When the server closes its side, the stream ends."""
    try:
        while data := await sock.receive_some(CHUNK):
            await stream.write(data)
    except Exception:  # noqa: BLE001
        pass
    scope.cancel()
