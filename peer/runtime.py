"""A running peer: load blocks, measure them, announce, serve, and leave cleanly.

Lifecycle: JOINING (record up, loading) -> ONLINE (serving) -> LEAVING (on SIGINT/SIGTERM:
refuse new sessions, let open ones finish for up to `drain_timeout`, then exit).

With `--tp K` the blocks are a tensor-parallel group (peer/tp/group.py): this process is rank
0 and starts the others. If a rank dies or hangs, the peer announces LEAVING, answers its open
sessions with PEER_FAILED for up to FAILURE_GRACE_S, stops the group and exits with status 1.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from dataclasses import replace
from functools import partial

from hexswarm.peer import upkeep
from hexswarm.peer.admission import Admission
from hexswarm.peer.announcer import Announcer
from hexswarm.peer.config import PeerConfig
from hexswarm.peer.core import PeerCore
from hexswarm.peer.debug import tampered_encoder, with_debug_faults
from hexswarm.peer.dht_mode import DHT_CLOSE_S
from hexswarm.peer.evidence_service import EvidenceService
from hexswarm.peer.faults import FaultInjector
from hexswarm.peer.joining import Joining, Rejoin, start_joining_for
from hexswarm.peer.link_probe import LinkProbe
from hexswarm.peer.peer_record import RecordSource, peer_record
from hexswarm.peer.plan_follower import PlanFollower, follower_trust, join_range
from hexswarm.peer.push import PushLinks, SwarmMembers
from hexswarm.peer.range_move import MoveParts, RangeMover
from hexswarm.peer.reachability import Reach, become_reachable
from hexswarm.peer.server import PeerServer
from hexswarm.peer.serving import Serving, weight_bytes_per_block
from hexswarm.peer.speed import announced_speed, degree_speeds
from hexswarm.peer.stacks import Stacks
from hexswarm.peer.tp.group import TPGroupError
from hexswarm.peer.tp.rebalance import Rebalancing, rebalance
from hexswarm.peer.upkeep import Upkeep
from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT
from hexswarm.swarm.coordinator.beside_peer import start_beside_peer
from hexswarm.swarm.coordinator.nudges import NUDGE_PROTOCOL
from hexswarm.swarm.nat.announce_relay import AnnounceRelay
from hexswarm.swarm.nat.port_relay import RELAY_PROTOCOL, RelayService
from hexswarm.swarm.nat.reachability.messages import DIALBACK_PROTOCOL
from hexswarm.swarm.nat.reachability.service import admission_group_of, ip_group_of, serve_helpers
from hexswarm.swarm.net.dht_process import shutdown_dht
from hexswarm.swarm.net.dialing import Dialer
from hexswarm.swarm.tools import log_setup
from hexswarm.swarm.trust.dht_signing import ANNOUNCE_PROTOCOL
from hexswarm.swarm.trust.evidence_wire import EVIDENCE_PROTOCOL
from hexswarm.swarm.trust.record_window import RecordWindow
from hexswarm.swarm.trust.records import PeerRecord, PeerState, fetch_peer_records, shard_records
from hexswarm.swarm.wire.protocol import SESSION_PROTOCOL
from hexswarm.swarm.wire.tensors import DTYPE_NAMES

logger = logging.getLogger(__name__)

# After a rank failure, how long open sessions get to hear PEER_FAILED on their next frame.
FAILURE_GRACE_S = 5.0
# The exit after the last session is gone is budgeted so that a peer with no open sessions
# exits within ~5 s of SIGTERM even when the DHT is unreachable: the "leaving" record gets
# LEAVE_ANNOUNCE_S (it is best effort: the record expires on its own anyway), the p2p handle
# P2P_CLOSE_S and the DHT process DHT_CLOSE_S (then it is killed, p2pd with it).
LEAVE_ANNOUNCE_S = 1.5
P2P_CLOSE_S = 0.5


async def serve(config: PeerConfig, joining: Joining | None = None) -> int:
    """Runs the peer until SIGINT/SIGTERM; returns the exit code. `joining`: the DHT node
    `start_joining` forked before the model code loaded (else it starts here)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    started = time.monotonic()
    if joining is None:  # in the main thread: it sets up signal dispositions for the DHT child
        joining = start_joining_for(config)
    identity = joining.identity
    dht = await asyncio.to_thread(joining.wait)
    name = config.name or f"{socket.gethostname()}-{identity.peer_id.to_base58()[-6:]}"
    log_setup.set_context(f"peer {name} {config.spec.model_id}[{config.start}:{config.end})")
    logger.info("peer %s joined the DHT as %s", name, identity.peer_id)
    dht, reach, check = await become_reachable(config, dht, identity, started, joining.client_mode)
    if config.auto:
        start, end = await join_range(dht, config.spec.model_id, config.spec.num_blocks, config.max_blocks)
        config = replace(config, start=start, end=end)
        log_setup.set_context(f"peer {name} {config.spec.model_id}[{start}:{end})")
        logger.info("--layers auto: Petals' rule chose blocks [%d:%d)", start, end)
    peer = _Peer(config, dht, identity, name, stop, reach, check)
    inbox = peer.follower.inbox if peer.follower else None  # its own candidate cannot dial it
    coordinator = start_beside_peer(config.coordinator, dht, identity, stop, inbox)
    try:
        await peer.announcer.announce(PeerState.JOINING)
        if not await peer.start_serving(stop):
            return 0
        await peer.run_until(stop)
        if peer.serving.core.failure is not None:
            await peer.leave_after_failure()
            return 1
        await peer.leave()
    except TPGroupError as e:
        logger.error("the tensor-parallel group failed: %s", e)
        await peer.say(PeerState.LEAVING)
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


class _Peer:
    """Builds and wires the services of a running peer, and runs the steps of its lifecycle.

    Each service gets the inputs it needs (the announcer, the follower, `swap`,
    `current_serving`, the config, `read_records`), never the peer: only this class knows all
    of its parts."""

    def __init__(
        self, config: PeerConfig, dht, identity, name: str, stop: asyncio.Event, reach: Reach, check
    ):
        self.config, self.dht, self.identity, self.name = config, dht, identity, name
        self.peer_id = identity.peer_id.to_base58()
        self.reach, self.reachability_check = reach, check
        self.rejoin = Rejoin(self.peer_id, config.initial_peers, reannounce=self._reannounce)
        self.dialer: Dialer | None = None  # once p2p is up
        self.relay: RelayService | None = None  # a direct peer relays for peers behind NAT
        self.stop = stop
        self.loop = asyncio.get_running_loop()
        self.serving: Serving | None = None  # what it serves, once loaded: changed only by `swap`
        self.stacks = Stacks(config, self._on_group_failure)  # its blocks, on a device or a group
        self.role = "both" if config.role == "auto" else config.role  # announced; auto: the plan's
        self.p2p = None
        self.pusher: PushLinks | None = None  # links to next peers (peer/push.py), kept across moves
        self.evidence: EvidenceService | None = None  # re-checks evidence of lies sent to this peer
        self.announcer = Announcer(
            dht, identity, self._record, config.spec.num_blocks, config.announce_period
        )
        self.mover = RangeMover(
            MoveParts(
                config=config,
                peer_id=self.peer_id,
                stop=stop,
                announcer=self.announcer,
                read_records=self.read_records,
                stacks=self.stacks,
                serving=self.current_serving,
                swap=self.swap,
                new_server=self.new_server,
            )
        )
        self.probe = LinkProbe(self.peer_id, self._open_link)  # through the p2p layer, once p2p is up
        self.follower = self._new_follower() if config.auto else None
        if config.debug_record:
            logger.warning("--debug-record: this peer announces %s on purpose", config.debug_record)
            self.announcer.encode = tampered_encoder(config.debug_record)

    def _new_follower(self) -> PlanFollower:
        """An auto peer's plan follower: it moves the peer through `mover`."""
        c = self.config
        return PlanFollower(
            self.dht,
            self.peer_id,
            c.spec.model_id,
            c.spec.num_blocks,
            self.mover.request,
            c.rebalance_period,
            trust=follower_trust(c.coordinator_trust, c.coordinator is not None, self.peer_id),
            take_role=self.take_role if c.role == "auto" else None,
        )

    def current_serving(self) -> Serving | None:
        """What it serves now (None before its blocks have loaded), for the services that swap it."""
        return self.serving

    def _record(self, state: PeerState) -> PeerRecord:
        """The record it announces in `state`, from what it serves, its reach, role and move."""
        source = RecordSource(
            config=self.config,
            peer_id=self.peer_id,
            name=self.name,
            serving=self.serving,
            reach=self.reach,
            role=self.role,
            device_info=self.stacks.device_info,
            group=self.stacks.group,
            next_range=self.mover.next_range,
            links=self.probe.published(),
            plan_version=self.follower.followed if self.follower else 0,
            relay_slots_free=self.relay.free_slots if self.relay else -1,
        )
        return peer_record(source, state)

    def swap(self, serving: Serving) -> None:
        """Serves `serving` from now on: new streams reach its server, and the next record
        announces its range and speed (the one place what a peer serves changes)."""
        self.serving = serving
        c = self.config
        log_setup.set_context(f"peer {self.name} {c.spec.model_id}[{serving.start}:{serving.end})")

    def take_role(self, role: str) -> None:
        """A `--role auto` peer serves the role its plan assignment names (announced next)."""
        if role != self.role:
            logger.info("taking the role %s (was %s), as the plan says", role, self.role)
            self.role = role

    async def start_serving(self, stop: asyncio.Event) -> bool:
        c = self.config
        blocks = await self.stacks.load_first()
        weight_bytes = weight_bytes_per_block(blocks)
        throughput, decode_batch = await announced_speed(c, blocks)
        speeds = await degree_speeds(self.config, self.stacks.group, throughput)
        if stop.is_set():
            return False
        blocks = with_debug_faults(blocks, c.debug_corrupt_outputs, c.debug_slow_ms)
        self.p2p = await self.dht.replicate_p2p()
        self.dialer = Dialer(self.p2p)
        # Pushes go only to peers that announce this model (a client writes the chain).
        self.pusher = PushLinks(self._open_link, members=SwarmMembers(self._member_ids))
        core = PeerCore(blocks, c.spec.model_id, c.limits, c.prefill_threads)
        server = self.new_server(core)
        self.swap(Serving(core, server, c.start, c.end, c.tp, throughput, decode_batch, weight_bytes, speeds))
        if c.faults is not None:
            server.faults = FaultInjector(core, c.faults)
            server.faults.install_signals(self.loop)
        await self.p2p.add_binary_stream_handler(SESSION_PROTOCOL, self._handle_stream)
        await self._serve_evidence()
        if self.follower is not None and not self.follower.trusts_none:  # "a new plan is out"
            await self.p2p.add_binary_stream_handler(NUDGE_PROTOCOL, self.follower.inbox.handle_stream)
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
        return True

    def new_server(self, core: PeerCore) -> PeerServer:
        """The stream server over `core` (at start, and after a range move): the peer's limits,
        its identity signing the sessions' commitments (swarm/wire/commitments.py), the bans it proved."""
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
        server.format = self.own_format()
        sources = self.reachability_check.sources  # a relayed remote's IP, as its relay saw it
        server.group_of = partial(admission_group_of, self.p2p, sources=sources) if self.p2p else None
        server.pusher = self.pusher  # links to next peers outlive a move
        if self.evidence is not None:  # re-checks run on the new blocks from now on
            self.evidence.core, self.evidence.scheduler = core, server.scheduler
            server.banned = self.evidence.banned
        return server

    async def _serve_evidence(self) -> None:
        """Re-checks evidence of lies sent to it and hands out what it proved (peer/evidence_service.py);
        streams from the peers it banned are refused."""
        self.evidence = EvidenceService(
            self.serving.core,
            self.serving.server.scheduler,
            self.dht,
            self.identity,
            self.own_format(),
            partial(admission_group_of, self.p2p, sources=self.reachability_check.sources),
        )
        self.serving.server.banned = self.evidence.banned
        await self.p2p.add_binary_stream_handler(EVIDENCE_PROTOCOL, self.evidence.handle_stream)

    def own_format(self) -> str:
        """The format this peer computes in, as tolerances name it (any quantized one is int8)."""
        c = self.config
        return "int8" if c.quant != DEFAULT_QUANT else DTYPE_NAMES.get(c.dtype, "float32")

    async def _handle_stream(self, *args) -> None:
        # Through the current server, so that a move (peer/plan_follower.py) can switch new
        # streams to the new range while streams already open stay on the old one.
        await self.serving.server.handle_stream(*args)

    async def _open_link(self, peer_id: str):
        """A session stream to a peer id at its record's addresses (a relay's port if behind NAT)."""
        return await self.dialer.open_stream(peer_id, SESSION_PROTOCOL)

    def _on_group_failure(self, reason: str) -> None:
        """Called from the group's watcher thread: fail the sessions and leave, on the event loop."""

        def fail() -> None:
            if self.serving is not None:
                self.serving.core.fail(reason)
            self.stop.set()

        self.loop.call_soon_threadsafe(fail)

    async def run_until(self, stop: asyncio.Event) -> None:
        """Serves until `stop`: every announce period it announces, re-checks its reachability and
        coordinates (`_every_announce_period`); beside that run the services below, started and
        stopped here. A range move (`mover`) runs when the plan asks, and ends in `close`."""
        window = RecordWindow.of(self.dht, self.config.spec.model_id)
        routine = Upkeep(
            read_records=partial(self.read_records, window),
            record=self._record,
            announcer=self.announcer,
            probe=self.probe,
            members=self.pusher.members,
            follower=self.follower,
            moving=lambda: self.mover.busy,
        )
        services = [asyncio.create_task(job, name=name) for name, job in self._services(routine, stop)]
        try:
            await self._every_announce_period(routine, stop)
        finally:
            for task in services:
                task.cancel()
            await asyncio.gather(*services, return_exceptions=True)

    def _services(self, routine: Upkeep, stop: asyncio.Event):
        """(name, coroutine) of each background service this peer runs while serving."""
        if self.follower is not None:  # an auto peer follows a new plan (peer/plan_follower.py)
            yield "plan watch", routine.watch_plans(stop)
        yield "bans", self.evidence.watch_bans(stop)  # bans lifted or expired stop refusing within 10 s
        group = self.stacks.group
        if group is not None and group.repartitioner is not None:  # --partition auto
            parts = Rebalancing(group, self.current_serving, self.swap, self.announcer)
            yield "rebalance", rebalance(parts, stop)

    async def _every_announce_period(self, routine: Upkeep, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.config.announce_period)
            except TimeoutError:
                self.serving.core.expire_idle()
                upkeep.log_hop_cost(self.serving.server)
                records = await routine.records_now()  # read once, for every step below
                await self._recheck_reachability(records)
                await self.announcer.announce(self.serving_state())
                self.rejoin.poke(self.dht, records, unstored=self.announcer.unstored > 0)
                await routine.coordinate(records or None)  # none read: it tries once more itself

    async def _reannounce(self) -> None:
        await self.announcer.announce(self.serving_state())

    def serving_state(self) -> PeerState:
        """ONLINE only while others can reach it, directly or through a relay."""
        return PeerState.JOINING if self.reach.mode == "unreachable" else PeerState.ONLINE

    async def _recheck_reachability(self, records: list[PeerRecord]) -> None:
        try:
            reach = await self.reachability_check.recheck(self.reach, records)
        except Exception:  # remote input must not stop serving
            logger.exception("re-checking the relays failed")
            return
        if reach.addrs != self.reach.addrs or reach.mode != self.reach.mode:
            logger.warning("reachability now %s via %s %s", reach.mode, reach.addrs, reach.reason)
        self.reach = reach

    async def _member_ids(self, peer_id: str) -> list[str]:
        """The peers of `peer_id`'s record shard that announce this model now (peer/push.py)."""
        records = await shard_records(self.dht, self.config.spec.model_id, peer_id)
        self.dialer.learn(records)
        return [r.peer_id for r in records]

    async def read_records(self, window: RecordWindow | None = None) -> list[PeerRecord]:
        """The model's records: read whole, or as a period's `window` follows them (swarm/trust/record_window.py)."""
        whole = window is None
        records = await (
            fetch_peer_records(self.dht, self.config.spec.model_id) if whole else window.records()
        )
        if self.dialer is not None:
            self.dialer.learn(records)
        return records

    async def say(self, state: PeerState) -> None:
        """Announces `state` for a period, giving up after LEAVE_ANNOUNCE_S (the record expires anyway)."""
        await self.announcer.announce(state, ttl=self.config.announce_period, timeout=LEAVE_ANNOUNCE_S)

    async def leave(self) -> None:
        """Refuses new sessions, lets open ones finish, and tells the swarm it is gone."""
        self.serving.core.leaving = True
        logger.info("leaving: refusing new sessions, %d open", len(self.serving.core.sessions))
        await self.say(PeerState.LEAVING)
        deadline = time.monotonic() + self.config.drain_timeout
        while self.serving.core.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if self.serving.core.sessions:
            logger.info("drain timeout: dropping %d open sessions", len(self.serving.core.sessions))
        # the last word: status, the monitor and clients drop this peer now, not when its record expires
        await self.say(PeerState.GONE)

    async def leave_after_failure(self) -> None:
        """Part of the group is gone: tell the swarm, and let open sessions hear PEER_FAILED."""
        logger.error("leaving after a failure: %s", self.serving.core.failure)
        await self.say(PeerState.LEAVING)
        deadline = time.monotonic() + min(FAILURE_GRACE_S, self.config.drain_timeout)
        while self.serving.core.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        """Stops what `serve` started, in this order: moves and drains, the reachability check
        and the relay, the server (its last hop costs logged) and its push links, the
        tensor-parallel ranks, the p2p handle, the DHT node."""
        self.mover.cancel()  # a move or drain in progress ends with the peer
        self.rejoin.close()
        self.reachability_check.close()
        if self.relay is not None:
            self.relay.close()
        if self.serving is not None:
            upkeep.log_hop_cost(self.serving.server)
            self.serving.server.close()
        if self.pusher is not None:
            self.pusher.close()
        await self.stacks.close()
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
