"""A helper's prober daemons, reused across dial-backs.

A dial-back must come from a libp2p host with no prior connection to the asker, or the asker's
own connection would prove it. Starting a fresh p2pd per request did that, at ~0.12 s of CPU a
request. A pool reuses a few daemons instead, with two catches:

1. libp2p's `connect` dials every address its peerstore holds for the peer, not only the one
   named: the addresses of earlier probes (2 minutes) and those the asker's identify reported
   (10 minutes or more). So a probe counts only if the prober's connection to the asker is at
   the very address it was asked to dial (`list_peers` says where a connection goes), and a
   prober that reached an asker at one address is not used for that asker's other addresses
   while it may remember it (TAINT_S): it would race them.
2. A daemon's state grows with what it dialed: each retires after MAX_USES probes or MAX_AGE_S.

At most MAX_CONCURRENT + MAX_IDLE daemons live at once (one per probe running, plus the idle
ones kept); an idle p2pd exits within a second when its owner dies (measured with a SIGKILLed
owner), so a pool leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from hexswarm.swarm.net.maddrs import tcp_addr, without_peer_id

logger = logging.getLogger(__name__)

MAX_IDLE = 2  # idle daemons kept for the next probes
IDLE_S = 60.0  # ... for at most this long
RETIRE_EVERY_S = 10.0
MAX_USES = 64  # probes a daemon runs before it retires
MAX_AGE_S = 600.0
TAINT_S = 900.0  # how long a daemon may remember an asker's addresses (libp2p's peerstore TTLs)
START_TIMEOUT_S = 10.0
SHUTDOWN_TIMEOUT_S = 5.0


@dataclass
class Prober:
    """One daemon and what it has done."""

    p2p: object
    started: float
    used_at: float = 0.0
    uses: int = 0
    reached: dict[str, tuple[str, float]] = field(default_factory=dict)  # asker -> (address, when)

    def fits(self, asker: str, target: str, now: float) -> bool:
        """Whether this daemon may probe `asker` at `target`: it reached the asker at no other
        address lately (it would dial that one too)."""
        addr, when = self.reached.get(asker, (target, 0.0))
        return addr == target or now - when > TAINT_S

    def spent(self, now: float) -> bool:
        return self.uses >= MAX_USES or now - self.started > MAX_AGE_S or now - self.used_at > IDLE_S


async def start_prober():
    """A daemon that listens nowhere and has no connection: the stranger of a dial-back."""
    from hivemind.p2p import P2P

    return await asyncio.wait_for(
        P2P.create(host_maddrs=[], no_listen=True, dht_mode="client", nat_port_map=False, auto_nat=False),
        START_TIMEOUT_S,
    )


class ProberPool:
    """Daemons lent one probe at a time; `start` makes a new one (a fake in tests). Its keeper
    task retires idle daemons as they age, and shuts every idle one down when the event loop
    ends (asyncio.run cancels what is left before it closes the loop), so none is left to the
    garbage collector after its loop is gone."""

    def __init__(self, start: Callable[[], Awaitable] = start_prober):
        self.start = start
        self.idle: list[Prober] = []
        self.closed = False
        self.keeper: asyncio.Task | None = None

    async def probe(self, asker: str, target: str, timeout: float) -> bool:
        """Whether a stranger's libp2p host completes a connection with `asker`'s key at
        `target` (a TCP multiaddr without /p2p/) within `timeout` seconds."""
        prober = await self._take(asker, target)
        ok = False
        try:
            ok = await asyncio.wait_for(_connects_at(prober.p2p, asker, target), timeout)
        except Exception as e:  # an unreachable address, a timeout, a daemon that failed
            logger.debug("probe of ...%s at %s: %s: %s", asker[-8:], target, type(e).__name__, e)
        finally:
            clean = await _disconnect(prober.p2p, asker)
            prober.uses += 1
            if ok:
                prober.reached[asker] = (target, time.monotonic())
            await self._give_back(prober, clean)
        return ok

    async def _take(self, asker: str, target: str) -> Prober:
        if self.closed:
            raise ConnectionError("the dial-back service is closing")
        if self.keeper is None:
            self.keeper = asyncio.create_task(self._keep(), name="dial-back-probers")
        now = time.monotonic()
        for prober in self.idle:
            if prober.fits(asker, target, now):
                self.idle.remove(prober)
                return prober
        started = await self.start()
        return Prober(started, time.monotonic(), time.monotonic())

    async def _keep(self) -> None:
        try:
            while not self.closed:
                await asyncio.sleep(RETIRE_EVERY_S)
                await self._retire(time.monotonic())
        finally:
            await self.close()

    async def _retire(self, now: float) -> None:
        for spent in [p for p in self.idle if p.spent(now)]:
            self.idle.remove(spent)
            await _shutdown(spent)

    async def _give_back(self, prober: Prober, clean: bool) -> None:
        now = prober.used_at = time.monotonic()
        await self._retire(now)
        if clean and not self.closed and not prober.spent(now) and len(self.idle) < MAX_IDLE:
            self.idle.append(prober)
        else:
            await _shutdown(prober)

    async def close(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, []
        for prober in idle:
            await _shutdown(prober)
        if self.keeper is not None and self.keeper is not asyncio.current_task():
            self.keeper.cancel()
            await asyncio.wait({self.keeper}, timeout=SHUTDOWN_TIMEOUT_S)


async def _connects_at(p2p, asker: str, target: str) -> bool:
    from hivemind.p2p import PeerID
    from hivemind.utils.multiaddr import Multiaddr

    await p2p._client.connect(PeerID.from_base58(asker), [Multiaddr(without_peer_id(target))])
    want = tcp_addr(target)
    for info in await p2p.list_peers():
        if info.peer_id.to_base58() == asker:
            return any(tcp_addr(str(a)) == want for a in info.addrs)
    return False


async def _disconnect(p2p, asker: str) -> bool:
    """Closes the prober's connections to `asker`; whether none is left (else it retires)."""
    from hivemind.p2p import PeerID

    try:
        await asyncio.wait_for(p2p._client.disconnect(PeerID.from_base58(asker)), SHUTDOWN_TIMEOUT_S)
        peers = await asyncio.wait_for(p2p.list_peers(), SHUTDOWN_TIMEOUT_S)
    except Exception:
        return False
    return all(info.peer_id.to_base58() != asker for info in peers)


async def _shutdown(prober: Prober) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(prober.p2p.shutdown(), SHUTDOWN_TIMEOUT_S)
