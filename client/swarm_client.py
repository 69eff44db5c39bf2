"""The client's window on the swarm: its DHT node, its p2p streams, and what peers there are.

It turns signed DHT records plus the client's own measured round trips into a plain
`routing.SwarmView` for whatever router the client uses.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from hexswarm.client.candidate_sample import (
    CANDIDATES_PER_BLOCK,
    READS_PER_CANDIDATE,
    ShardReads,
    sample_per_block,
)
from hexswarm.client.coverage_errors import FormatMismatchError, MissingBlocksError, ModelMismatchError
from hexswarm.client.group_cap import RECORDS_PER_GROUP, cap_per_group
from hexswarm.client.observed import ObservedSpeeds
from hexswarm.client.peer_views import peer_view
from hexswarm.client.remote import PeerConnection, PeerError
from hexswarm.client.worker import event_loop, run_sync
from hexswarm.routing.chains.peer_links import links_from_reports
from hexswarm.routing.chains.swarm_view import SwarmView
from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT
from hexswarm.swarm.net.dht import start_dht
from hexswarm.swarm.net.dht_process import shutdown_dht
from hexswarm.swarm.net.dht_read import DHT_READ_TIMEOUT_S
from hexswarm.swarm.net.dialing import Dialer, private_ok
from hexswarm.swarm.net.identity import Identity
from hexswarm.swarm.net.rejoin import contacts_from, ping_missing
from hexswarm.swarm.tools.terminal_text import printable
from hexswarm.swarm.trust import speed_reports
from hexswarm.swarm.trust.bans import load_bans
from hexswarm.swarm.trust.records import (
    PeerRecord,
    PeerState,
    block_ranges,
    links_by_peer,
    online_peers_per_block,
    read_models,
    read_peer_records,
)

logger = logging.getLogger(__name__)

COVERAGE_NOTICE_S = 2.0  # a wait for coverage longer than this is said in the log
OBSERVED_PUBLISH_TIMEOUT_S = 5.0  # at shutdown: what it observed is stored, or given up on

RTT_TTL_S = 60.0  # how long a measured round trip is trusted
SAMPLE_ROUNDS = 3  # samples of a block's candidates while all it pinged stay silent
MIN_OPEN_TIMEOUT_S = 0.5  # a stream open always gets this long, even after a slow dial
PING_TIMEOUT_S = 5.0
# A round trip is the fastest of a few pings on one stream: a single one (a stream's first, or
# one that met a busy event loop on either side) can be several times the link's.
PING_ROUNDS = 3


# A swarm that announces other models and none of ours for this long is serving another checkpoint
# (a peer of ours that is starting would have announced by then; its model entry goes out first).
MISMATCH_GRACE_S = 5.0
# A DHT read near the coverage deadline still gets this long: a swarm that answers in time is not
# read as empty just because the caller's clock has almost run out.
MIN_READ_TIMEOUT_S = 1.0
REJOIN_TIMEOUT_S = 20.0  # swarm/net/rejoin.py's own step bound, and a margin
BACKGROUND_DRAIN_S = 20.0


@dataclass
class SwarmClient:
    """Owns a client-mode DHT node and a p2p handle to its daemon."""

    dht: object
    p2p: object
    rtt_ms: dict[str, tuple[float, float]] = field(default_factory=dict)  # peer -> (ms, measured at)
    view_version: int = 0
    # peers caught returning wrong outputs (client/verify.py), by this client or an earlier one on
    # this machine (swarm/trust/bans.py): left out of every route for 30 days, unlike a session's BanList (client/retry.py), whose bans of failed or
    # slow peers expire
    distrusted: set[str] = field(default_factory=set)
    silent: set[str] = field(default_factory=set)  # peers whose failed ping was logged (once each)
    ping_errors: dict[str, str] = field(default_factory=dict)  # peer -> why its last ping failed
    # weight formats this client routes through (a peer's record says its own: swarm/trust/records.py)
    quants: tuple[str, ...] = (DEFAULT_QUANT,)
    _last_snapshot: tuple | None = None
    dialer: Dialer | None = None  # dials peers at their records' addresses (relay circuits)
    background: set = field(default_factory=set)  # work that outlives a call (sharing evidence)
    observed: ObservedSpeeds = field(default_factory=ObservedSpeeds)  # decode times it measured itself
    observed_shared_at: float = float("-inf")  # monotonic time it last published them
    observed_model: str = ""  # the model they were observed on
    # a router sees at most this many records of one IP group per block (client/group_cap.py)
    records_per_group: int = RECORDS_PER_GROUP
    # and at most about this many records per block, the ones it pings (client/candidate_sample.py)
    candidates_per_block: int = CANDIDATES_PER_BLOCK
    seed: bytes = field(default_factory=lambda: secrets.token_bytes(16))  # which of a group it sees
    shard_reads: ShardReads | None = None  # which of the model's record keys it reads (the same module)
    initial_peers: tuple[str, ...] = ()  # pinged again while the swarm looks empty (swarm/net/rejoin.py)

    def __post_init__(self) -> None:
        if self.dialer is None:  # a public swarm's client skips records' LAN addresses (swarm/net/dialing.py)
            self.dialer = Dialer(self.p2p, private_ok=private_ok(self.initial_peers))
        self.distrusted |= set(load_bans())  # this machine's earlier verdicts (swarm/trust/bans.py)
        if self.shard_reads is None:
            self.shard_reads = ShardReads(self.seed, self.candidates_per_block * READS_PER_CANDIDATE)

    @classmethod
    def connect(
        cls,
        initial_peers: Sequence[str],
        host_maddrs: Sequence[str] | None = None,
        quants: tuple[str, ...] = (DEFAULT_QUANT,),
    ) -> SwarmClient:
        """A client-mode DHT node; with no `host_maddrs` it only dials out (no port, no NAT mapping).
        It routes only through peers whose weight format is one of `quants`."""
        identity = signing_identity()
        if host_maddrs is None:
            dht = start_dht(initial_peers, identity=identity, client_mode=True, listen=False)
        else:
            dht = start_dht(initial_peers, identity=identity, host_maddrs=host_maddrs, client_mode=True)
        p2p = run_sync(dht.replicate_p2p(), timeout=30)
        return cls(dht=dht, p2p=p2p, quants=tuple(quants), initial_peers=tuple(initial_peers))

    def spawn(self, coro) -> None:
        """Runs `coro` on the client loop in the background (from any thread); `shutdown` gives
        what is still running BACKGROUND_DRAIN_S to end."""
        future = asyncio.run_coroutine_threadsafe(coro, event_loop())
        self.background.add(future)
        future.add_done_callback(self.background.discard)

    def shutdown(self) -> None:
        future = self._publish_observed()  # what this client saw outlives it
        if future is not None:
            try:
                future.result(OBSERVED_PUBLISH_TIMEOUT_S)
            except Exception as e:
                logger.debug("publishing observed speeds at shutdown: %s", type(e).__name__)
        if self.background:
            concurrent.futures.wait(list(self.background), BACKGROUND_DRAIN_S)
            for future in list(self.background):
                future.cancel()
        try:
            run_sync(self.p2p.shutdown(), timeout=10)
        except Exception as e:
            logger.debug("p2p shutdown: %s", e)
        shutdown_dht(self.dht, 5)

    def online_records(
        self, model_id: str, num_blocks: int, timeout: float = DHT_READ_TIMEOUT_S, any_format: bool = False
    ) -> list[PeerRecord]:
        """Online, trusted peers of the model whose layer range fits it (a bad record must not break
        routing) and whose weight format this client accepts (or any, with `any_format`); none if
        the DHT does not answer within `timeout` seconds."""
        deadline = time.monotonic() + timeout  # over every shard read: a second read gets what is left

        def usable(shards: list[int]) -> list[PeerRecord]:
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            records = read_peer_records(self.dht, model_id, left, shards)
            self.dialer.learn(records)
            return [
                r
                for r in records
                if r.state == PeerState.ONLINE
                and 0 <= r.start < r.end <= num_blocks
                and r.peer_id not in self.distrusted
                and (any_format or r.quant in self.quants)
            ]

        return self.shard_reads.read(usable, num_blocks, int(time.monotonic() // RTT_TTL_S))

    def wait_for_coverage(self, model_id: str, num_blocks: int, timeout: float) -> list[PeerRecord]:
        """Online records once every block is served, polling the DHT; MissingBlocksError on timeout."""
        began = time.monotonic()

        def read_timeout() -> float:  # each DHT read ends by the caller's deadline (or soon after it)
            left = timeout - (time.monotonic() - began)
            return min(DHT_READ_TIMEOUT_S, max(left, MIN_READ_TIMEOUT_S))

        told = False
        while True:
            records = self.online_records(model_id, num_blocks, read_timeout())
            missing = uncovered_blocks(records, num_blocks)
            if not missing:
                return records
            waited = time.monotonic() - began
            if not told and waited >= COVERAGE_NOTICE_S:  # one line, so a wait is never silent
                told = True
                logger.warning(
                    "no online peer serves blocks %s of %s yet; waiting up to %.0f s for them",
                    block_ranges(missing),
                    model_id,
                    timeout,
                )
            if waited >= min(MISMATCH_GRACE_S, timeout):
                self._raise_on_a_mismatch(model_id, num_blocks, missing, waited, read_timeout())
            if time.monotonic() - began >= timeout:
                raise MissingBlocksError(model_id, missing, time.monotonic() - began)
            self.rejoin()
            time.sleep(0.5)

    def rejoin(self) -> None:
        """Pings the initial peers missing from this node's routing table: a bootstrap that
        restarted is not found again otherwise (swarm/net/rejoin.py)."""
        contacts = contacts_from(self.initial_peers, [], own_id="")
        if not contacts or self.dht is None:
            return
        try:
            run_sync(ping_missing(self.dht, contacts), timeout=REJOIN_TIMEOUT_S)
        except Exception as e:  # the next poll tries again
            logger.debug("re-joining the DHT: %s", type(e).__name__)

    def _raise_on_a_mismatch(
        self, model_id: str, num_blocks: int, missing: list[int], waited: float, timeout: float
    ) -> None:
        """Fails at once, rather than at the coverage timeout, when what is missing is served
        but not as this client asked: only in formats it does not accept, or only other models."""
        everyone = self.online_records(model_id, num_blocks, timeout, any_format=True)
        if everyone and not uncovered_blocks(everyone, num_blocks):
            offered = sorted({r.quant for r in everyone if r.quant not in self.quants})
            raise FormatMismatchError(model_id, missing, self.quants, offered)
        if not read_peer_records(self.dht, model_id, timeout):
            served = sorted(set(read_models(self.dht, timeout)) - {model_id})
            if served:
                raise ModelMismatchError(model_id, num_blocks, served, waited)

    def view(
        self,
        records: list[PeerRecord],
        num_blocks: int,
        hidden_size: int,
        ping_timeout: float = PING_TIMEOUT_S,
        peer_links: bool = False,
    ) -> SwarmView:
        """A SwarmView of `records`, with fresh round trips (peers that do not answer are left out);
        with `peer_links`, the round trips between them that their records report (for pushed chains)."""
        self._share_observed(records)
        records = cap_per_group(records, self.records_per_group, self.seed)
        rtts = self.sampled_round_trips(records, ping_timeout)
        peers = tuple(peer_view(r, self.observed) for r in records if r.peer_id in rtts)
        links = (
            links_from_reports(links_by_peer([r for r in records if r.peer_id in rtts])) if peer_links else {}
        )
        # Routers cache their work per version: bump it only when what they see has changed.
        snapshot = (peers, tuple(sorted(rtts.items())), tuple(sorted(links.items())), num_blocks)
        if snapshot != self._last_snapshot:
            self._last_snapshot = snapshot
            self.view_version += 1
        return SwarmView(
            num_blocks=num_blocks,
            peers=peers,
            client_rtt_ms=rtts,
            peer_rtt_ms=links,
            hidden_size=hidden_size,
            version=self.view_version,
        )

    def _share_observed(self, records: list[PeerRecord]) -> None:
        """Every PUBLISH_EVERY_S, once it has figures, this client publishes what it observed of
        peers' decode speeds, signed, for the coordinator and `status` (swarm/trust/speed_reports.py);
        and once more as it shuts down."""
        if records:
            self.observed_model = records[0].model_id
        now = time.monotonic()
        if now - self.observed_shared_at >= speed_reports.PUBLISH_EVERY_S:
            future = self._publish_observed()
            if future is not None:
                self.observed_shared_at = now
                self.spawn(_logged(future, "publishing observed speeds"))

    def _publish_observed(self):
        figures = self.observed.figures()
        if not figures or not self.observed_model or self.dht is None:
            return None
        marker = RSASignatureValidator().local_public_key  # the key this process's DHT node signs with
        return speed_reports.publish(self.dht, marker, self.observed_model, figures, get_dht_time())

    def sampled_round_trips(
        self, records: list[PeerRecord], timeout: float = PING_TIMEOUT_S
    ) -> dict[str, float]:
        """Round trips to a bounded sample of `records` per block (client/candidate_sample.py),
        the only peers a router then sees; a block whose sampled peers all stay silent is
        sampled again among the others, up to SAMPLE_ROUNDS times."""
        now = time.monotonic()
        fresh = self._fresh_rtts(now)
        epoch = int(now // RTT_TTL_S)
        rtts: dict[str, float] = {}
        tried: set[str] = set()
        for _ in range(SAMPLE_ROUNDS):
            served = {b for r in records if r.peer_id in rtts for b in range(r.start, r.end)}
            left = [r for r in records if r.peer_id not in tried and not set(range(r.start, r.end)) <= served]
            sample = sample_per_block(left, self.candidates_per_block, fresh, self.seed, epoch)
            if not sample:
                break
            tried.update(r.peer_id for r in sample)
            rtts.update(self.round_trips(sample, timeout))
        return rtts

    def round_trips(self, records: list[PeerRecord], timeout: float = PING_TIMEOUT_S) -> dict[str, float]:
        """peer id -> round trip in ms (a PING, re-measured after RTT_TTL_S), dialed at the
        records' addresses; silent peers are left out (`ping_errors` says why)."""
        self.dialer.learn(records)
        return run_sync(self._measure_rtts(records, timeout), timeout=timeout + 5)

    def _fresh_rtts(self, now: float) -> set[str]:
        """Peers whose round trip was measured less than RTT_TTL_S before `now` (not pinged again)."""
        return {p for p, (_, at) in self.rtt_ms.items() if now - at < RTT_TTL_S}

    async def _measure_rtts(self, records: list[PeerRecord], timeout: float) -> dict[str, float]:
        now = time.monotonic()
        fresh = self._fresh_rtts(now)
        stale = [r for r in records if r.peer_id not in fresh]
        results = await asyncio.gather(*(self._ping(r, timeout) for r in stale), return_exceptions=True)
        for record, result in zip(stale, results, strict=True):
            if isinstance(result, float):
                self.rtt_ms[record.peer_id] = (result, now)
                self.silent.discard(record.peer_id)
                self.ping_errors.pop(record.peer_id, None)
            else:
                self.rtt_ms.pop(record.peer_id, None)
                reason = (str(result).splitlines() or [type(result).__name__])[0][:200] or type(
                    result
                ).__name__
                self.ping_errors[record.peer_id] = reason
                if record.peer_id not in self.silent:  # one line per peer until it answers again
                    self.silent.add(record.peer_id)
                    logger.info(
                        "peer %s does not answer pings (%s); leaving it out", printable(record.name), reason
                    )
        return {r.peer_id: self.rtt_ms[r.peer_id][0] for r in records if r.peer_id in self.rtt_ms}

    async def _ping(self, record: PeerRecord, timeout: float) -> float:
        began = time.monotonic()
        conn = await self.open_connection(record.peer_id, record.name, timeout=timeout)
        try:
            conn.timeout = timeout
            best = await conn.ping()
            for _ in range(PING_ROUNDS - 1):
                left = timeout - (time.monotonic() - began)
                if left <= best / 1000:  # the whole measurement stays within `timeout`
                    break
                conn.timeout = left
                best = min(best, await conn.ping())
            return best
        finally:
            conn.close()

    async def open_connection(self, peer_id: str, name: str, timeout: float) -> PeerConnection:
        """A session stream, dialed at the peer's record addresses first; all within `timeout`."""
        peer = PeerID.from_base58(peer_id)
        began = time.monotonic()
        await self.dialer.connect(peer, timeout / 2)  # a stalled peer leaves the stream half the time
        left = max(timeout - (time.monotonic() - began), MIN_OPEN_TIMEOUT_S)
        return await PeerConnection.connect(self.p2p, peer, name, left)

    def forget(self, peer_id: str) -> None:
        """Drops what the client measured of a peer that failed, so it is re-measured."""
        self.rtt_ms.pop(peer_id, None)


_identity_lock = threading.Lock()
_signing_identity_taken = False  # one daemon per process may run under the process's key


def signing_identity() -> Identity | None:
    """This process's DHT signing key as its libp2p identity too (a fresh temporary file), for
    the first client of the process; None (a random libp2p identity) for any later one, since
    two daemons of one peer id would be one remote to every peer. A node connected to that
    client then knows the IP group its signed speed reports come from
    (swarm/trust/speed_reports.py, `connected_groups`)."""
    global _signing_identity_taken
    from hivemind.proto import crypto_pb2
    from hivemind.utils.crypto import RSAPrivateKey

    with _identity_lock:
        if _signing_identity_taken:
            return None
        _signing_identity_taken = True
    key = RSAPrivateKey.process_wide()  # what RSASignatureValidator() signs with
    directory = Path(tempfile.mkdtemp(prefix="hexswarm-client-id-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    data = crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=key.to_bytes()).SerializeToString()
    path = directory / "identity.key"
    path.write_bytes(data)
    path.chmod(0o400)
    return Identity(identity_path=path, private_key=key, peer_id=PeerID.from_identity(data), fresh=True)


async def _logged(future, what: str) -> None:
    """Awaits background work (a concurrent future) whose failure is worth a debug line, not an error."""
    try:
        await asyncio.wait_for(asyncio.wrap_future(future), 10)
    except Exception as e:
        logger.debug("%s failed: %s", what, type(e).__name__)


def uncovered_blocks(records: list[PeerRecord], num_blocks: int) -> list[int]:
    """Blocks no online record serves."""
    return [b for b, n in enumerate(online_peers_per_block(records, num_blocks)) if n == 0]


__all__ = [
    "SwarmClient",
    "MissingBlocksError",
    "ModelMismatchError",
    "FormatMismatchError",
    "PeerError",
    "uncovered_blocks",
]
