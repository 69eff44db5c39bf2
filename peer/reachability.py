"""How a peer becomes reachable: directly, or through relays' ports when it is behind NAT.

At start (docs/architecture.md, "Crossing NATs"), its DHT node has joined as a client unless
it listens on loopback only or is told it is direct (peer/dht_mode.py), and:
1. A few reachable nodes (the initial peers first, then direct peers of the model, drawn by the
   relay slots each announces free), one per IP group first, dial the peer back (swarm/nat/reachability/); one that stays BUSY or does not
   answer is replaced by another. A peer that listens on loopback only serves this machine and
   asks no one. If at least half of those that answer reach it (only the initial peers' answers
   count when one of them answered), it is `direct` and announces the addresses that helpers of
   two IP groups reached (by its own connections to them; a forwarded port included), one of
   them an initial peer when any answered. Where the initial peers all share one IP group (a
   lab, a private swarm), their answers alone decide, as the user named them. A direct verdict
   with no such address is treated as behind NAT: strangers of one group cannot place an
   address in its record. A direct peer's node restarts as a DHT server, on the same ports.
2. Otherwise its DHT node stays a client (it stores nothing for others), and it asks
   up to WANT_RELAYS reachable nodes for a relay slot (swarm/nat/port_relay.py): direct peers
   first, drawn by the slots each announces free, so that peers joining at once spread over
   them in proportion; the initial peers after them, and at most one slot on a bootstrap while
   direct peers can relay; helpers that did not answer its dial-back last. A peer of a fixed
   range asks its chain predecessors first (direct peers whose range ends where its own
   starts): a step they push to it then crosses their own link to it, not a third node's two
   (docs/routing.md, "Pushed chains"). It
   is `relayed` once a relay has dialed it through the slot it holds for it (a relay vouches for
   its own slot: no helper dials another node's ports), and it announces those ports.
3. With no slot that works it is `unreachable`: it stays joining and says why.

While it serves, `recheck` (each announce period) has new slots dialed through (a slot that
worked is dialed again only every SLOT_REVERIFY_S), drops a relay that is gone, and asks
another reachable node for a slot, so a relay that leaves is replaced within
one or two periods; nodes that just failed it are asked last. A relay whose slot is gone
takes its address out of the record at once, even when no relay answers, and a slot that
ends (its relay died) is replaced at once, not a period later.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from hexswarm.peer.dht_mode import restarter
from hexswarm.swarm.nat.port_relay import RelayLimits, Slot, TunnelSources, hold_slot
from hexswarm.swarm.nat.reachability.client import ask, ask_many, helper_groups, reachable_verdict
from hexswarm.swarm.nat.reachability.verdicts import (
    chosen_first,
    confirmed_addrs,
    observed_group,
    relay_verified,
)
from hexswarm.swarm.net.dialing import Dialer
from hexswarm.swarm.net.maddrs import ip_group, is_loopback, peer_id_of, tcp_addr
from hexswarm.swarm.trust.records import PeerRecord, PeerState, fetch_peer_records

logger = logging.getLogger(__name__)

MODES = ("auto", "direct", "relayed")
MAX_HELPERS = 3  # nodes asked to dial back at once (more stand by for those BUSY or gone)
WANT_RELAYS = 2  # slots a peer behind NAT holds, so that one relay may leave
RELAY_WAIT_S = 15.0  # how long slots get before the peer calls itself unreachable
RELAY_RETRY_S = 0.5
FAILED_RELAY_S = 60.0  # a node whose slot or dial just failed is asked last for this long
SLOT_REVERIFY_S = 600.0  # a slot that works is dialed through again after this long
RELAY_WEIGHT_CAP = RelayLimits().max_slots  # the most free slots a record is believed to have
UNSTATED_WEIGHT = 1  # ... and what one that states none weighs (a peer that predates the field)


@dataclass(frozen=True)
class Reach:
    """What the peer announces about how to reach it."""

    mode: str  # direct, relayed or unreachable
    addrs: tuple[str, ...]  # what others dial: verified direct addresses, or relays' ports
    relays: tuple[str, ...] = ()  # relay peer ids, for status
    reason: str = ""  # why it is unreachable, or why direct was not verified
    known_s: float = 0.0  # seconds from the start until the dial-back answered
    relayed_s: float = 0.0  # ... until a relay's port was confirmed
    observed_group: str = ""  # the IP group helpers saw it connect from (routers group it by that)


@dataclass(frozen=True)
class Candidate:
    """A reachable node: a helper for dial-backs and, for peers behind NAT, a relay."""

    peer_id: str
    addr: str  # its address, ending with /p2p/<peer_id>


def candidates(
    initial_peers: Sequence[str], direct_records: Sequence, rng: random.Random | None = None
) -> list[Candidate]:
    """The initial peers first (bootstraps), then direct peers of the model drawn by the relay
    slots they have free (`by_free_slots`); one address each."""
    found: dict[str, str] = {}
    for addr in initial_peers:
        peer = peer_id_of(addr)
        if peer and tcp_addr(addr):
            found.setdefault(peer, addr)
    for record in by_free_slots(direct_records, rng or random.Random()):
        for addr in record.addrs:
            if tcp_addr(addr) and peer_id_of(addr) == record.peer_id:
                found.setdefault(record.peer_id, addr)
                break
    return [Candidate(peer, addr) for peer, addr in found.items()]


def by_free_slots(records: Sequence, rng: random.Random) -> list:
    """`records` in a random order, each drawn with a chance in proportion to the relay slots it
    announces free (Efraimidis and Spirakis' weighted sampling: the keys u^(1/w)): peers behind
    NAT that join at once spread over the direct peers by what each can take, instead of all
    asking the first in the DHT's order, and the dial-back helpers drawn after the initial peers
    spread too. A peer's claim counts up to RELAY_WEIGHT_CAP (a liar draws no more than an
    honest empty relay); a full one comes last; one that does not say weighs UNSTATED_WEIGHT."""

    def key(record) -> float:
        free = record.relay_slots_free
        weight = UNSTATED_WEIGHT if free < 0 else min(free, RELAY_WEIGHT_CAP)
        return rng.random() ** (1.0 / weight) if weight > 0 else -1.0

    return sorted(records, key=key, reverse=True)


def by_group(found: Sequence[Candidate]) -> list[Candidate]:
    """`found` in order, one of each IP group (by the address it is dialed at) before any second:
    helpers drawn from distinct groups, so that one group's many identities are asked once."""
    seen: set[str] = set()
    first, later = [], []
    for c in found:
        addr = tcp_addr(c.addr)
        group = ip_group(addr.ip) if addr else c.peer_id
        (later if group in seen else first).append(c)
        seen.add(group)
    return first + later


def relay_order(
    found: Sequence[Candidate], silent: set[str], upstream: set[str], initial_peers: Sequence[str]
) -> list[Candidate]:
    """Whom to ask for relay slots, in order: `found` (direct peers drawn by their free slots)
    with helpers that did not answer a dial-back last, chain predecessors (`upstream`) first,
    and the initial peers after the direct peers: bootstraps relay when direct peers cannot,
    instead of holding a slot of every peer behind NAT."""
    boots = {peer_id_of(a) for a in initial_peers}
    return sorted(found, key=lambda c: (c.peer_id in silent, c.peer_id not in upstream, c.peer_id in boots))


def direct_peers(records: Sequence) -> list:
    """The model's online peers that others can dial directly: helpers and relays to ask."""
    return [r for r in records if r.reachability == "direct" and r.state == PeerState.ONLINE]


def predecessors(records: Sequence, serves: tuple[int, int] | None) -> set[str]:
    """Peers whose range can end a hop where `serves` starts: whom a step is pushed from."""
    if serves is None or serves[0] == 0:
        return set()
    return {r.peer_id for r in records if r.ends_a_hop_at(serves[0])}


def nat_message(listen_addrs: Sequence[str], relays: Sequence[str], pinned: bool = True) -> str:
    """The line that tells a volunteer behind NAT how to be reached directly. A port the system
    chose (`pinned` False: --host-maddrs ends in /tcp/0) changes each start, so forwarding it
    would stop working at the next one: the line says to pin a port first."""
    ports = sorted({a.port for a in map(tcp_addr, listen_addrs) if a is not None})
    if ports and pinned:
        advice = f"forward TCP port {ports[0]} on your router to this machine"
    else:
        example = ports[0] if ports else 31337
        advice = (
            f"start it with a fixed port (--host-maddrs /ip4/0.0.0.0/tcp/{example}; the port it has "
            "now was chosen for this start only) and forward that TCP port on your router to this machine"
        )
    return (
        f"behind NAT: no node could dial this peer, so it serves through relay(s) "
        f"{', '.join('...' + r[-8:] for r in relays)}; for a direct path, {advice}"
    )


def local_endpoint(listen_addrs: Sequence[str]) -> tuple[str, int] | None:
    """Where a tunnel reaches this peer's own daemon: its loopback address if it listens there."""
    addrs = [a for a in map(tcp_addr, listen_addrs) if a is not None]
    for addr in sorted(addrs, key=lambda a: a.ip not in ("127.0.0.1", "::1")):
        return addr.ip, addr.port
    return None


class Reachability:
    """Runs the steps of the module docstring for one peer and holds its relay slots."""

    def __init__(
        self,
        peer_id: str,
        mode: str,
        started: float,
        restart_dht: Callable[[], Awaitable],
        limits: RelayLimits | None = None,
        pinned_port: bool = True,
        serves: tuple[int, int] | None = None,
        joined_as_client: bool = False,
    ):
        self.peer_id, self.mode, self.started = peer_id, mode, started
        self.joined_as_client = joined_as_client  # its DHT node (peer/dht_mode.py)
        self.serves = serves  # its fixed range [start, end), or None (an auto peer's may move)
        self.pinned_port = pinned_port  # whether its listening port stays across restarts
        self.restart_dht = restart_dht  # (client_mode, listen) -> a new DHT node, the old one shut down
        self.limits = limits or RelayLimits()
        self.helpers: list[Candidate] = []
        self.relays: list[Candidate] = []  # whom to ask for slots, in order
        self.slots: dict[str, Slot] = {}  # relay id -> its live slot
        self.verified: dict[str, float] = {}  # slot address -> when its relay dialed us through it
        self.holders: dict[str, asyncio.Task] = {}  # relay id -> the task holding its slot
        self.failed_at: dict[str, float] = {}  # node id -> when holding a slot on it last failed
        self.initial_peers: tuple[str, ...] = ()
        self.closing = False
        self.sources = TunnelSources()  # who is behind each tunnel, for limits per IP group
        self.observed_group = ""  # the IP group the dial-back helpers saw
        self.p2p = self.dialer = self.local = None

    async def run(
        self, dht, initial_peers: Sequence[str], read_records: Callable[[], Awaitable[Sequence]]
    ) -> tuple[object, Reach]:
        """(the DHT to serve on, how this peer is reached); `read_records` reads the model's
        records, for direct peers to ask, only when the peer asks anyone."""
        listen = tuple(str(a) for a in dht.get_visible_maddrs())
        self.initial_peers = tuple(initial_peers)
        if self.mode == "direct":
            return dht, Reach("direct", listen, reason="--reachability direct: not checked")
        if self.mode == "auto" and listen and all(is_loopback(a) for a in listen):
            # it serves this machine only, where everyone can dial it: nothing to ask anyone
            return await self._serving(dht, listen), Reach(
                "direct", listen, reason="listens on loopback only"
            )
        try:
            records = await read_records()
        except Exception:  # remote input; the initial peers alone can still check
            records = []
        everyone = [c for c in candidates(initial_peers, direct_peers(records)) if c.peer_id != self.peer_id]
        silent: set[str] = set()  # helpers asked for a dial-back that did not answer
        known = time.monotonic() - self.started
        if self.mode == "auto":
            verdict, addrs, replies = await self._dial_back(await dht.replicate_p2p(), everyone, listen)
            known = time.monotonic() - self.started
            if verdict is None:
                logger.warning("no node answered a dial-back; announcing as directly reachable, unverified")
                reach = Reach("direct", listen, reason="no node answered a dial-back", known_s=known)
                return await self._serving(dht, listen), reach
            if verdict and addrs:
                logger.info("reachable directly at %s (%.1f s after start)", ", ".join(addrs), known)
                return await self._serving(dht, listen), Reach("direct", addrs, known_s=known)
            if verdict:
                logger.warning("dialed back from one IP group only: no address is confirmed; using relays")
            silent = {h.peer_id for h in self.helpers} - {r.helper for r in replies if r is not None}
            self.observed_group = observed_group(chosen_first(replies, self.initial_peers))
        self.relays = relay_order(everyone, silent, predecessors(records, self.serves), initial_peers)
        if not self.joined_as_client:  # behind NAT: a client-mode node stores nothing for others
            dht = await self.restart_dht(client_mode=True)
        self.p2p = await dht.replicate_p2p()
        self.dialer = Dialer(self.p2p)
        self.local = local_endpoint([str(a) for a in dht.get_visible_maddrs()])
        reach = await self._first_slots(known)
        if reach.mode == "relayed":
            logger.warning(nat_message(listen, reach.relays, self.pinned_port))
            logger.info(
                "reachability known %.1f s, relay slot confirmed %.1f s after start",
                reach.known_s,
                reach.relayed_s,
            )
        else:
            logger.error("unreachable: %s", reach.reason)
        return dht, reach

    async def _serving(self, dht, listen: tuple[str, ...]):
        """`dht` as a DHT server, for a direct peer: restarted so, on the ports of `listen`, if
        it joined as a client (peer/dht_mode.py)."""
        return await self.restart_dht(client_mode=False, listen=listen) if self.joined_as_client else dht

    async def _dial_back(self, p2p, everyone: list[Candidate], listen: tuple[str, ...]):
        """(the verdict, the addresses confirmed, the replies) of helpers drawn one per IP group."""
        ordered = by_group(everyone)
        self.helpers = ordered[:MAX_HELPERS]
        spares = [c.peer_id for c in ordered[MAX_HELPERS:]]
        replies = await ask_many(p2p, [h.peer_id for h in self.helpers], listen, spares)
        groups = await helper_groups(p2p, [r.helper for r in replies if r is not None])
        verdict = reachable_verdict(chosen_first(replies, self.initial_peers))
        return verdict, confirmed_addrs(replies, groups, self.initial_peers, self.peer_id), replies

    async def _first_slots(self, known: float) -> Reach:
        if self.local is None or not self.relays:
            return Reach("unreachable", (), reason="no reachable node to relay through", known_s=known)
        deadline = time.monotonic() + RELAY_WAIT_S
        while True:
            self._ask_for_slots()
            addrs = await self._verified() if self.slots else ()
            if addrs:
                return self._relayed(addrs, known, time.monotonic() - self.started)
            if time.monotonic() > deadline:
                reason = (
                    f"no relay gave a working slot within {RELAY_WAIT_S:.0f} s (asked {len(self.holders)})"
                )
                return Reach("unreachable", (), reason=reason, known_s=known)
            await asyncio.sleep(RELAY_RETRY_S)

    def _ask_for_slots(self) -> None:
        """Starts holding slots on the first relays not yet asked, up to WANT_RELAYS live ones,
        at most one of them on a bootstrap while a direct peer is there to ask: the bootstraps
        then carry less of the swarm's traffic, and losing one costs a peer one slot, not two."""
        boots = {peer_id_of(a) for a in self.initial_peers}
        while len(self.holders) < WANT_RELAYS and not self.closing:
            now = time.monotonic()
            free = [r for r in self.relays if r.peer_id not in self.holders]
            if not free:
                return
            # nodes whose slot or dial just failed last (a stable sort keeps the order otherwise)
            free.sort(key=lambda r: now - self.failed_at.get(r.peer_id, float("-inf")) < FAILED_RELAY_S)
            on_a_boot = any(p in boots for p in self.holders)
            relay = min(free, key=lambda r: on_a_boot and r.peer_id in boots)  # the first of the best
            task = asyncio.create_task(self._hold(relay), name=f"relay-slot-{relay.peer_id[-8:]}")
            self.holders[relay.peer_id] = task

    async def _hold(self, relay: Candidate) -> None:
        try:
            self.dialer.addrs[relay.peer_id] = (relay.addr,)
            await self.dialer.connect(_peer(relay.peer_id))
            ip = tcp_addr(relay.addr).ip
            await hold_slot(self.p2p, relay.peer_id, ip, self.local, self._on_slot, self.limits, self.sources)
        except Exception as e:
            self.failed_at[relay.peer_id] = time.monotonic()
            logger.info("relay ...%s: %s: %s", relay.peer_id[-8:], type(e).__name__, str(e)[:200])
        finally:
            had_slot = self.slots.pop(relay.peer_id, None) is not None
            # the relay is spent: ask the others first next time
            self.relays = [r for r in self.relays if r.peer_id != relay.peer_id] + [relay]
            if had_slot and not self.closing:  # a relay that died: take another slot now, not next period
                self.holders.pop(relay.peer_id, None)
                self._ask_for_slots()

    def _on_slot(self, slot: Slot) -> None:
        self.slots[slot.relay_id] = slot
        self.failed_at.pop(slot.relay_id, None)

    async def _verified(self) -> tuple[str, ...] | None:
        """Slot addresses their own relay dialed us through; None if none is and no relay
        answered. A slot is asked about once, and again only after SLOT_REVERIFY_S: while its
        relay holds it, the slot's own stream says when it is gone (`_hold`), so asking every
        period (two dial-backs per relayed peer a period, on the relays) learned nothing."""
        now = time.monotonic()
        live = {s.addr(self.peer_id) for s in self.slots.values()}
        self.verified = {a: at for a, at in self.verified.items() if a in live and now - at < SLOT_REVERIFY_S}
        slots = [s for s in self.slots.values() if s.addr(self.peer_id) not in self.verified]
        replies = await asyncio.gather(*(ask(self.p2p, s.relay_id, [s.addr(self.peer_id)]) for s in slots))
        if slots and not self.verified and all(r is None or r.error for r in replies):
            return None  # nobody could check (busy, gone)
        self.verified.update(dict.fromkeys(relay_verified(slots, replies, self.peer_id), now))
        return tuple(
            s.addr(self.peer_id) for s in self.slots.values() if s.addr(self.peer_id) in self.verified
        )

    def _relayed(self, addrs: tuple[str, ...], known: float, relayed: float) -> Reach:
        relays = tuple(s.relay_id for s in self.slots.values() if s.addr(self.peer_id) in addrs)
        return Reach(
            "relayed", addrs, relays, known_s=known, relayed_s=relayed, observed_group=self.observed_group
        )

    async def recheck(self, reach: Reach, records: Sequence = ()) -> Reach:
        """A relayed peer's slots, re-dialed: relays that are gone are replaced by other
        reachable nodes (bootstraps, then direct peers). A direct peer is left as it is."""
        if reach.mode == "direct" or self.p2p is None:
            return reach
        for peer_id in [p for p, task in self.holders.items() if task.done()]:
            del self.holders[peer_id]
        everyone = candidates(self.initial_peers, direct_peers(records))
        everyone = [c for c in everyone if c.peer_id != self.peer_id]
        known = {r.peer_id for r in self.relays}
        self.relays += [c for c in everyone if c.peer_id not in known]
        self._ask_for_slots()
        addrs = await self._verified() if self.slots else ()
        if addrs is None:  # nobody could check: no news is not bad news, but a gone slot is
            return self._without_gone_slots(reach)
        if addrs:
            return self._relayed(addrs, reach.known_s, reach.relayed_s)
        return Reach("unreachable", (), reason="no relay slot could be dialed", known_s=reach.known_s)

    def _without_gone_slots(self, reach: Reach) -> Reach:
        """`reach` less the addresses of slots that are gone (their relay died or closed them)."""
        live = {slot.addr(self.peer_id) for slot in self.slots.values()}
        kept = tuple(a for a in reach.addrs if a in live)
        if kept == reach.addrs:
            return reach
        if kept:
            return self._relayed(kept, reach.known_s, reach.relayed_s)
        reason = "every relay it held a slot on is gone, and no node answered a dial-back"
        return Reach("unreachable", (), reason=reason, known_s=reach.known_s)

    def close(self) -> None:
        self.closing = True
        for task in self.holders.values():
            task.cancel()


def _peer(peer_id: str):
    from hivemind.p2p import PeerID

    return PeerID.from_base58(peer_id)


async def become_reachable(config, dht, identity, started: float, joined_as_client: bool):
    """(the DHT to serve on, the peer's Reach, the check that re-dials its relays), for a peer
    with `config` (its PeerConfig) that joined on `dht` at `started` (time.monotonic()), as a
    DHT client or not (peer/joining.py `Joining.client_mode`)."""

    async def records() -> list[PeerRecord]:
        return await fetch_peer_records(dht, config.spec.model_id)

    pinned = not any(maddr.rstrip("/").endswith("/tcp/0") for maddr in config.host_maddrs)
    check = Reachability(
        identity.peer_id.to_base58(),
        config.reachability,
        started,
        restarter(config, identity, dht),
        pinned_port=pinned,
        serves=None if config.auto else (config.start, config.end),
        joined_as_client=joined_as_client,
    )
    dht, reach = await check.run(dht, config.initial_peers, records)
    return dht, reach, check
