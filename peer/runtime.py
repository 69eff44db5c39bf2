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
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch

from hexswarm import swarm
from hexswarm.peer.admission import Admission, AdmissionLimits
from hexswarm.peer.announcer import Announcer
from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import Blocks, PeerCore, PeerLimits
from hexswarm.peer.debug import CorruptOutputs, SlowBlocks, tampered_encoder
from hexswarm.peer.devices import describe
from hexswarm.peer.evidence_service import EvidenceService
from hexswarm.peer.faults import FaultInjector, FaultPlan
from hexswarm.peer.joining import Joining, start_joining
from hexswarm.peer.link_probe import LinkProbe
from hexswarm.peer.plan_follower import PLAN_WATCH_S, PlanFollower, join_range
from hexswarm.peer.push import PushLinks, SwarmMembers
from hexswarm.peer.range_move import RangeMover
from hexswarm.peer.reachability import Reach, Reachability
from hexswarm.peer.scheduler import BatchPolicy
from hexswarm.peer.server import PeerServer
from hexswarm.peer.throughput import measure_or_load
from hexswarm.peer.tp_group import TPGroup, TPGroupError
from hexswarm.peer.tp_rebalance import rebalance
from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT
from hexswarm.swarm import log_setup
from hexswarm.swarm.announce_relay import AnnounceRelay
from hexswarm.swarm.coordinator.records import Trust, dht_get
from hexswarm.swarm.dht import start_dht
from hexswarm.swarm.dht_process import shutdown_dht
from hexswarm.swarm.dht_signing import ANNOUNCE_PROTOCOL
from hexswarm.swarm.dialing import Dialer
from hexswarm.swarm.evidence_wire import EVIDENCE_PROTOCOL
from hexswarm.swarm.model_spec import ModelSpec
from hexswarm.swarm.port_relay import RELAY_PROTOCOL, RelayLimits, RelayService
from hexswarm.swarm.protocol import SESSION_PROTOCOL, ProtocolError
from hexswarm.swarm.reachability import DIALBACK_PROTOCOL, admission_group_of, ip_group_of, serve_helpers
from hexswarm.swarm.records import PeerRecord, PeerState, model_key, peer_records_from
from hexswarm.swarm.wire_tensors import DTYPE_NAMES

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
    quant: str = "none"  # weight format of the blocks' linear layers (peer/quant.py)
    role: str = "both"  # what clients send here: both, prefill, decode, or auto (the plan's)
    name: str | None = None
    announce_period: float = 15.0
    drain_timeout: float = 30.0
    max_frame_bytes: int = 64 << 20
    max_buffered_bytes: int = 1 << 30  # frames held at once over all streams
    handshake_timeout: float = 30.0  # seconds a stream may stay open without a session (peer/server.py)
    max_streams: int = 64
    throughput: float | None = None  # announce this instead of the measured prefill tokens/s per block
    decode_ms: float | None = None  # announce this instead of the measured decode ms per block
    tp_timeout: float = 30.0  # bound on every collective and on a rank's silence (seconds)
    partition: str = "even"  # how a group splits each layer: even, or auto (Hepti's LP; tp_partition.py)
    slowdowns: dict = field(default_factory=dict)  # benchmark only: rank -> Slowdown (tp_profile.py)
    # The coordinator (peer/plan_follower.py, swarm/coordinator/): an auto peer's range is chosen
    # on join and moved by the plan or by Petals' rule; a fixed peer is never moved.
    auto: bool = False
    # --layers auto --tp auto: the degrees the plan may choose among (peer/tp_group.py serves a
    # stack at degree k on the first k devices); () = always all of `devices`.
    tp_choices: tuple[int, ...] = ()
    max_blocks: int = 0  # most blocks an auto peer takes (0: as many as --layers auto allows)
    region: str = ""
    rebalance_period: float = 60.0  # Petals' rule check, when no coordinator is live
    move_wait: float = 30.0  # longest a move waits for others to cover the range it drops
    coordinator: Any = None  # a swarm.coordinator.service.CoordinatorConfig: run a candidate here
    batch: BatchPolicy = BatchPolicy()  # decode batching and prefill chunking (peer/scheduler.py)
    faults: FaultPlan | None = None  # debug fault injection (peer.faults); None in production
    admission: AdmissionLimits = AdmissionLimits()  # per-remote and per-session limits
    debug_corrupt_outputs: str = ""  # tests only: a way to compute wrong outputs (peer/debug.py LIES)
    debug_slow_ms: float = 0.0  # tests only: every forward this much slower than measured
    coordinator_trust: Trust = None  # whose plans an auto peer follows (swarm/coordinator/records.py)
    debug_record: dict = field(default_factory=dict)  # tests only: fields announced over the honest ones
    # torch threads for steps of many tokens (prefill) when decode runs on fewer (peer/devices.py)
    prefill_threads: int | None = None
    # How others reach this peer (peer/reachability.py): auto (dial-back, relays behind NAT),
    # or what the operator knows: direct (not checked) or relayed (behind NAT, no check)
    reachability: str = "auto"
    relay_limits: RelayLimits = field(default_factory=RelayLimits)  # what it relays for others once direct

    @property
    def tp(self) -> int:
        """Ranks in the group (the degree the peer starts at)."""
        return len(self.devices)


async def serve(config: PeerConfig, joining: Joining | None = None) -> int:
    """Runs the peer until SIGINT/SIGTERM; returns the exit code. `joining`: the DHT node
    `start_joining` forked before the model code loaded (else it starts here)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    started = time.monotonic()
    if joining is None:  # in the main thread: it sets up signal dispositions for the DHT child
        joining = start_joining(
            config.initial_peers, config.identity_path, config.host_maddrs, config.announce_maddrs
        )
    identity = joining.identity
    dht = await asyncio.to_thread(joining.wait)
    name = config.name or f"{socket.gethostname()}-{identity.peer_id.to_base58()[-6:]}"
    log_setup.set_context(f"peer {name} {config.spec.model_id}[{config.start}:{config.end})")
    logger.info("peer %s joined the DHT as %s", name, identity.peer_id)
    dht, reach, check = await _become_reachable(config, dht, identity, started)
    if config.auto:
        start, end = await join_range(dht, config.spec.model_id, config.spec.num_blocks, config.max_blocks)
        config = replace(config, start=start, end=end)
        log_setup.set_context(f"peer {name} {config.spec.model_id}[{start}:{end})")
        logger.info("--layers auto: Petals' rule chose blocks [%d:%d)", start, end)
    peer = _Peer(config, dht, identity, name, stop, reach, check)
    coordinator = _start_coordinator(config, dht, identity, stop)
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
        if coordinator is not None:
            stop.set()
            try:
                await asyncio.wait_for(coordinator, 30)
            except Exception:  # the peer still leaves cleanly
                logger.exception("the coordinator candidate ended with an error")
        await peer.close()
    return 0


async def _become_reachable(config: PeerConfig, dht, identity, started: float):
    """(the DHT to serve on, the peer's Reach, the check that re-dials its relays)."""

    async def restart_dht():  # behind NAT: a client-mode node stores nothing for others
        await asyncio.to_thread(shutdown_dht, dht, DHT_CLOSE_S)
        return start_dht(config.initial_peers, identity, config.host_maddrs, client_mode=True)

    async def records() -> list[PeerRecord]:
        return peer_records_from(await dht_get(dht, model_key(config.spec.model_id)), config.spec.model_id)

    check = Reachability(identity.peer_id.to_base58(), config.reachability, started, restart_dht)
    dht, reach = await check.run(dht, config.initial_peers, records)
    return dht, reach, check


def _start_coordinator(config: PeerConfig, dht, identity, stop: asyncio.Event) -> asyncio.Task | None:
    """`--coordinator`: a coordinator candidate on this peer's DHT node, ended by `stop`."""
    if config.coordinator is None:
        return None
    from hexswarm.swarm.coordinator.service import Coordinator

    return asyncio.create_task(Coordinator(dht, identity, config.coordinator).run(stop), name="coordinator")


def _follower_trust(config: PeerConfig, peer_id: str) -> Trust:
    """Whose plans this auto peer follows: the named keys, and its own coordinator candidate's
    (`--coordinator` runs one with the peer's key, which trusts itself)."""
    trust = config.coordinator_trust
    return trust | {peer_id} if trust is not None and config.coordinator is not None else trust


class _Peer:
    """The parts of a running peer, and the steps of its lifecycle."""

    def __init__(
        self, config: PeerConfig, dht, identity, name: str, stop: asyncio.Event, reach: Reach, check
    ):
        self.config, self.dht, self.identity, self.name = config, dht, identity, name
        self.reach, self.reachability_check = reach, check
        self.dialer: Dialer | None = None  # once p2p is up
        self.relay: RelayService | None = None  # a direct peer relays for peers behind NAT
        self.stop = stop
        self.loop = asyncio.get_running_loop()
        self.core: PeerCore | None = None
        self.group: TPGroup | None = None
        self.rebalancer: asyncio.Task | None = None  # re-partitions a --partition auto group
        self.device_info = ()
        self.throughput = (0.0, 0.0)
        self.decode_batch = (1, 0.0)  # (sessions, tokens/s per block) of batched decode; 0: not measured
        self.speeds: dict[int, tuple[float, float]] = {}  # degree -> its measured (throughput, decode ms)
        self.weight_bytes = 0  # bytes one block's weights take over the whole group, once loaded
        self.role = "both" if config.role == "auto" else config.role  # announced; auto: the plan's
        self.p2p = None
        self.server: PeerServer | None = None
        self.evidence: EvidenceService | None = None  # re-checks evidence of lies sent to this peer
        self.start, self.end, self.tp = config.start, config.end, config.tp
        self.next_range: tuple[int, int] | None = None  # loading it to move there
        self.mover = RangeMover(self)
        peer_id = identity.peer_id.to_base58()
        self.probe = LinkProbe(peer_id, self._open_link)  # through the p2p layer, once p2p is up
        self.follower = (
            PlanFollower(
                dht,
                peer_id,
                config.spec.model_id,
                config.spec.num_blocks,
                self.mover.request,
                config.rebalance_period,
                trust=_follower_trust(config, peer_id),
                take_role=self.take_role if config.role == "auto" else None,
            )
            if config.auto
            else None
        )
        self.announcer = Announcer(
            dht, identity, self._record, config.spec.num_blocks, config.announce_period
        )
        if config.debug_record:
            logger.warning("--debug-record: this peer announces %s on purpose", config.debug_record)
            self.announcer.encode = tampered_encoder(config.debug_record)

    def take_role(self, role: str) -> None:
        """A `--role auto` peer serves the role its plan assignment names (announced next)."""
        if role != self.role:
            logger.info("taking the role %s (was %s), as the plan says", role, self.role)
            self.role = role

    def _record(self, state: PeerState) -> PeerRecord:
        c = self.config
        return PeerRecord(
            peer_id=self.identity.peer_id.to_base58(),
            name=self.name,
            model_id=c.spec.model_id,
            start=self.start,
            end=self.end,
            state=state,
            throughput=self.throughput[0],
            decode_ms_per_block=self.throughput[1],
            decode_batch_size=self.decode_batch[0],
            decode_batch_tokens_per_s=self.decode_batch[1],
            cache_tokens_left=self.core.session_cache_tokens_left if self.core else 0,
            open_sessions=len(self.core.sessions) if self.core else 0,
            max_length=c.limits.max_length,
            dtype=DTYPE_NAMES.get(c.dtype, str(c.dtype)),
            device=",".join(str(d) for d in c.devices),
            version=swarm.__version__,
            addrs=self.reach.addrs,
            reachability=self.reach.mode,
            relays=self.reach.relays,
            tp=self.tp,
            devices=self.device_info[: self.tp],
            tp_choices=c.tp_choices,
            tp_speeds=tuple((tp, *speed) for tp, speed in sorted(self.speeds.items())),
            quant=c.quant,
            weight_bytes_per_block=self.weight_bytes,
            role=self.role,
            **self._partition_fields(),
            region=c.region,
            rtt_ms=self.probe.published(),
            auto=c.auto,
            max_blocks=c.max_blocks,
            plan_version=self.follower.followed if self.follower else 0,
            next_start=self.next_range[0] if self.next_range else 0,
            next_end=self.next_range[1] if self.next_range else 0,
        )

    def _partition_fields(self) -> dict:
        """The record's tp_* fields of an uneven split (nothing for an even one)."""
        group = self.group
        if group is None or group.partition is None or group.repartitioner is None:
            return {}
        partition, config = group.partition, self.config.spec.config
        return {
            "tp_partition": group.split.mode,
            "tp_shares": tuple(zip(partition.heads(config), partition.mlp_columns, strict=True)),
            "tp_predicted_step_ms": group.predicted_step_s() * 1000,
            "tp_observed_step_ms": group.observed_step_s * 1000,
            "tp_repartitions": group.repartitions,
        }

    async def speed_of(self, blocks: Blocks) -> tuple[tuple[float, float], tuple[int, float]]:
        """What to announce for `blocks`: (prefill tokens/s, decode ms) per block and (sessions,
        tokens/s per block) of batched decode; measured once per shape and degree (cached)."""
        c = self.config
        throughput, decode_batch = (c.throughput or 0.0, c.decode_ms or 0.0), (1, 0.0)
        if c.throughput is None or c.decode_ms is None:
            try:  # through every rank of a group, collectives included
                figures = await asyncio.to_thread(measure_or_load, blocks, c.prefill_threads)
            except ProtocolError as e:
                raise TPGroupError(e.message) from None
            throughput = (c.throughput or figures.tokens_per_s, c.decode_ms or figures.decode_ms_per_block)
            if c.batch.batching:
                decode_batch = (figures.decode_batch_size, figures.decode_batch_tokens_per_s)
        if not (c.batch.batching and decode_batch[1]):  # one step at a time
            decode_batch = (1, 1000 / throughput[1])
        logger.info(
            "throughput %.0f tokens/s per block (prefill), %.2f ms per block (decode), "
            "%.0f tokens/s per block decoding %d sessions at once (tp %d)",
            *throughput,
            decode_batch[1],
            decode_batch[0],
            blocks.tp,
        )
        return throughput, decode_batch

    async def start_serving(self, stop: asyncio.Event) -> bool:
        c = self.config
        blocks = await self._load_blocks()
        self.weight_bytes = weight_bytes_per_block(blocks)
        self.throughput, self.decode_batch = await self.speed_of(blocks)
        await self._measure_degrees()
        if stop.is_set():
            return False
        if c.debug_corrupt_outputs:
            logger.warning(
                "--debug-corrupt-outputs %s: this peer computes WRONG outputs on purpose",
                c.debug_corrupt_outputs,
            )
            blocks = CorruptOutputs(blocks, c.debug_corrupt_outputs)
        if c.debug_slow_ms:
            blocks = SlowBlocks(blocks, c.debug_slow_ms)
        self.core = PeerCore(blocks, c.spec.model_id, c.limits, c.prefill_threads)
        self.server = self.new_server(self.core)
        if c.faults is not None:
            self.server.faults = FaultInjector(self.core, c.faults)
            self.server.faults.install_signals(self.loop)
        self.p2p = await self.dht.replicate_p2p()
        self.server.group_of = partial(admission_group_of, self.p2p)  # limits per IP group too
        self.dialer = Dialer(self.p2p)
        # Pushes go only to peers that announce this model (a client writes the chain).
        self.server.pusher = PushLinks(self._open_link, members=SwarmMembers(self._member_ids))
        await self.p2p.add_binary_stream_handler(SESSION_PROTOCOL, self._handle_stream)
        await self._serve_evidence()
        # edge peers (peer/edge/) may announce through any full peer, as through a bootstrap
        relay = AnnounceRelay(self.dht, self.identity, partial(ip_group_of, self.p2p))
        await self.p2p.add_binary_stream_handler(ANNOUNCE_PROTOCOL, relay.handle_stream)
        if self.reach.mode == "direct":  # peers behind NAT ask reachable ones for dial-backs and slots
            self.relay = await serve_helpers(self.p2p, c.relay_limits)
        await self.announcer.announce(self.serving_state())
        if self.reach.mode == "unreachable":
            logger.error(
                "joining, not online (%s); retrying every %.0f s", self.reach.reason, c.announce_period
            )
        else:
            logger.info(
                "online: serving %s blocks [%d:%d) (%s)", c.spec.model_id, c.start, c.end, self.reach.mode
            )
        if self.group is not None and self.group.repartitioner is not None:
            self.rebalancer = asyncio.create_task(rebalance(self, stop), name="rebalance")
        return True

    def new_server(self, core: PeerCore) -> PeerServer:
        """The stream server over `core` (at start, and after a range move): the peer's limits,
        its identity signing the sessions' commitments (swarm/commitments.py), the bans it proved."""
        c = self.config
        server = PeerServer(
            core,
            c.max_frame_bytes,
            c.max_streams,
            c.batch,
            Admission(c.admission),
            c.handshake_timeout,
            c.max_buffered_bytes,
        )
        server.signer = self.identity
        server.group_of = partial(admission_group_of, self.p2p) if self.p2p is not None else None
        if self.evidence is not None:  # re-checks run on the new blocks from now on
            self.evidence.core, self.evidence.scheduler = core, server.scheduler
            server.banned = self.evidence.banned
        return server

    async def _serve_evidence(self) -> None:
        """Re-checks evidence of lies sent to it and hands out what it proved (peer/evidence_service.py);
        streams from the peers it banned are refused."""
        c = self.config
        own_format = "int8" if c.quant != DEFAULT_QUANT else DTYPE_NAMES.get(c.dtype, "float32")
        self.evidence = EvidenceService(
            self.core,
            self.server.scheduler,
            self.dht,
            self.identity,
            own_format,
            partial(ip_group_of, self.p2p),
        )
        self.server.banned = self.evidence.banned
        await self.p2p.add_binary_stream_handler(EVIDENCE_PROTOCOL, self.evidence.handle_stream)

    async def _measure_degrees(self) -> None:
        """`--tp auto` peers announce what they measured at each degree (`tp_speeds`): the full
        group's figures and, on a one-block stack loaded and freed for it, the leader's alone,
        so the coordinator knows a rank's speed and what the group's all-reduce costs. With
        --throughput and --decode-ms given, the peer announces those figures and no tp_speeds."""
        c = self.config
        if not c.tp_choices or (c.throughput is not None and c.decode_ms is not None):
            return
        self.speeds[self.tp] = self.throughput
        if 1 in c.tp_choices and self.tp > 1:
            stack = await asyncio.to_thread(self.group.load_stack, self.start, self.start + 1, 1)
            try:
                self.speeds[1], _ = await self.speed_of(stack)
            finally:
                self.group.drop_stack(stack)

    async def _handle_stream(self, *args) -> None:
        # Through the current server, so that a move (peer/plan_follower.py) can switch new
        # streams to the new range while streams already open stay on the old one.
        await self.server.handle_stream(*args)

    async def _open_link(self, peer_id: str):
        """A session stream to a peer id, dialed at its signed record's addresses (a relay's port
        for a peer behind NAT): for pushed steps (peer/push.py) and round-trip probes
        (peer/link_probe.py)."""
        return await self.dialer.open_stream(peer_id, SESSION_PROTOCOL)

    async def _load_blocks(self) -> Blocks:
        c = self.config
        if c.tp == 1:
            device = c.devices[0]
            threads = torch.get_num_threads() if device.type == "cpu" else None
            self.device_info = (describe(device, threads),)
            return await asyncio.to_thread(
                BlockStack.load, c.spec, c.start, c.end, c.dtype, device, quant=c.quant
            )
        self.group = TPGroup(
            c.spec,
            c.start,
            c.end,
            c.dtype,
            c.devices,
            c.tp_timeout,
            self._on_group_failure,
            c.tp_choices,
            quant=c.quant,
            partition=c.partition,
            slowdowns=c.slowdowns,
        )
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
        watch = asyncio.create_task(self._watch_plans(stop), name="plan watch") if self.follower else None
        try:
            await self._every_announce_period(stop)
        finally:
            if watch is not None:
                watch.cancel()

    async def _every_announce_period(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.config.announce_period)
            except TimeoutError:
                self.core.expire_idle()
                self._log_hop_cost()
                await self._recheck_reachability()
                await self.announcer.announce(self.serving_state())
                await self._coordinate()

    def serving_state(self) -> PeerState:
        """ONLINE only while others can reach it, directly or through a relay."""
        return PeerState.JOINING if self.reach.mode == "unreachable" else PeerState.ONLINE

    async def _recheck_reachability(self) -> None:
        try:
            reach = await self.reachability_check.recheck(self.reach, await self.read_records())
        except Exception:  # remote input must not stop serving
            logger.exception("re-checking the relays failed")
            return
        if reach.addrs != self.reach.addrs or reach.mode != self.reach.mode:
            logger.warning("reachability now %s via %s %s", reach.mode, reach.addrs, reach.reason)
        self.reach = reach

    async def _coordinate(self) -> None:
        """Measures round trips and, for an auto peer, follows the plan (or Petals' rule)."""
        try:
            records = await self.read_records()
            if self.server.pusher is not None:
                self.server.pusher.members.update(r.peer_id for r in records)
            await self.probe.step(records)
            if self.follower is not None and not self.mover.busy:
                followed = self.follower.followed
                await self.follower.step(records, self._record(PeerState.ONLINE), time.monotonic())
                if self.follower.followed != followed:  # say so now, not a period later (status, monitor)
                    await self.announcer.announce(PeerState.ONLINE)
        except Exception:  # the swarm's records are remote input: a bad step must not stop serving
            logger.exception("coordination step failed")

    async def _watch_plans(self, stop: asyncio.Event) -> None:
        """An auto peer follows a newly published plan within PLAN_WATCH_S."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=PLAN_WATCH_S)
            except TimeoutError:
                pass
            if stop.is_set() or self.mover.busy:
                continue
            try:
                if await self.follower.follow_newer(self._record(PeerState.ONLINE)):
                    await self.announcer.announce(PeerState.ONLINE)  # the plan followed, at once
            except Exception:  # the plans are remote input: a bad read must not stop serving
                logger.exception("reading the coordinator's plan failed")

    async def _member_ids(self) -> list[str]:
        """The peers announcing this model now: whom pushes may go to (peer/push.py)."""
        return [r.peer_id for r in await self.read_records()]

    async def read_records(self) -> list[PeerRecord]:
        records = peer_records_from(
            await dht_get(self.dht, model_key(self.config.spec.model_id)), self.config.spec.model_id
        )
        if self.dialer is not None:
            self.dialer.learn(records)
        return records

    def _log_hop_cost(self) -> None:
        stats, scheduler = self.server.hop_stats.take(), self.server.scheduler
        busy_s, period_s = scheduler.take_busy()  # of this period, whether steps ran or not
        if stats.steps:
            sizes = dict(sorted(scheduler.batch_sizes.items()))
            logger.info(
                "%s; decode batches (rows: count) %s; compute busy %.3f s of %.3f s",
                stats.summary(), sizes, busy_s, period_s,
            )  # fmt: skip
            scheduler.batch_sizes.clear()

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
        # the last word: status, the monitor and clients drop this peer now, not when its record expires
        await self.announcer.announce(
            PeerState.GONE, ttl=self.config.announce_period, timeout=LEAVE_ANNOUNCE_S
        )

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
        self.mover.cancel()  # a move or drain in progress ends with the peer
        self.reachability_check.close()
        if self.relay is not None:
            self.relay.close()
        if self.rebalancer is not None:
            self.rebalancer.cancel()
        if self.server is not None:
            self._log_hop_cost()
            self.server.close()
            if self.server.pusher is not None:
                self.server.pusher.close()
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
        await self.p2p.remove_binary_stream_handler(ANNOUNCE_PROTOCOL)
        if self.relay is not None:
            await self.p2p.remove_binary_stream_handler(DIALBACK_PROTOCOL)
            await self.p2p.remove_binary_stream_handler(RELAY_PROTOCOL)
        await self.p2p.shutdown()


def weight_bytes_per_block(blocks) -> int:
    """Bytes one block's weights take on this peer: a tensor-parallel group's leader holds 1/tp
    of each block (its `local` stack) and every rank as much, or with an uneven split its share
    of the block's weights (peer/tp_partition.py)."""
    local = getattr(blocks, "local", blocks)
    group = getattr(blocks, "group", None)
    if group is not None and group.repartitioner is not None and blocks.tp == group.tp:
        return int(local.weight_bytes_per_block() / group.repartitioner.weight_share(0))
    return local.weight_bytes_per_block() * blocks.tp
