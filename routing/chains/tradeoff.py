"""The latency-throughput trade-off mode (Explorative Study, §II-B4), with fronts cached per snapshot.

Design: an NSGA-II run (routing.chains.nsga) takes a few hundred ms, far too long to pay
per request, but its front depends only on the snapshot and the request's class (batch
size and the cache tokens it needs). So:

1. the front is cached per (snapshot version, request class); a miss never waits for
   NSGA-II: it answers from the min-latency solver under a throughput floor set by the
   preference (`floor_route`) and hands the run to a worker thread, which also refreshes
   the classes seen recently when a new snapshot version arrives;
2. the first decision on a snapshot picks on the cached front (microseconds); later ones
   add this client's own picks since the snapshot to its load (routing.chains.own_picks)
   and pick on the front re-scored under that load, solving again only when the pool's
   best may be more than 2% off (routing.chains.loaded_pool). That, not a random draw,
   keeps many requests routed on one stale snapshot from piling onto one chain;
3. when the pick runs on the idle min-latency chain's peers, it takes that chain's split
   of blocks between them (routing.chains.idle_split);
4. a request re-routed around refused peers (`exclude`) takes the cached point nearest the
   preference only while that point (or one within `spread` of it) survives; otherwise it
   solves again without the excluded peers, as min_latency does.

`spread` > 0 still draws among the front points within that normalised distance of the
preferred one (seeded). With `background=False` a miss computes the front inline
(deterministic; what tests and the load simulator use).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

from hexswarm.routing.chains.cost import candidates, make_route, no_route_error, request_cache_tokens
from hexswarm.routing.chains.front import Front, neighbours, pick_index
from hexswarm.routing.chains.idle_split import IdleChains, keep_idle_split
from hexswarm.routing.chains.load_costs import load_aware_candidates, session_step_ms
from hexswarm.routing.chains.loaded_pool import Pool, loaded_front
from hexswarm.routing.chains.max_throughput import floor_route
from hexswarm.routing.chains.nsga import NsgaConfig, nsga_front
from hexswarm.routing.chains.own_picks import OwnPicks
from hexswarm.routing.chains.request_class import (
    RequestClass,
    class_cache_floor,
    class_request,
    request_class,
)
from hexswarm.routing.chains.swarm_view import Route, RouteRequest, SwarmView

log = logging.getLogger(__name__)

CacheKey = tuple[int, RequestClass]  # (snapshot version, request class)


@dataclass(frozen=True)
class CachedFront:
    """A front plus what a decision needs precomputed."""

    front: Front
    peer_sets: tuple[frozenset[str], ...]  # peers of each route, to honour `exclude`
    room: np.ndarray  # least cache tokens left among each route's peers, to honour a request's need
    choices: np.ndarray  # indices a decision with no exclusions draws from
    step_ms: float  # the snapshot's session step (routing.chains.load_costs.session_step_ms)


# Chosen by benchmarks/router.py: under the simulated load the latency end of the load-aware
# front beat the knee (which takes more hops; each costs a round trip per token) at every
# size and load measured; see docs/benchmarks.md (Router).
DEFAULT_PREFERENCE = 0.0
KNEE = "knee"  # preference="knee": the knee of the front


class TradeoffRouter:
    """Router (routing.chains.swarm_view.Router) picking on a cached NSGA-II front; see module docstring.

    preference: 0 = least (load-aware) latency .. 1 = most throughput; None means
    DEFAULT_PREFERENCE, and "knee" the front's knee. load_aware=False scores chains by the
    idle cost model (routing.chains.cost) instead of routing.chains.load_costs.
    """

    def __init__(
        self,
        preference: float | str | None = None,
        *,
        config: NsgaConfig | None = None,
        spread: float = 0.0,
        seed: int = 0,
        background: bool = True,
        max_entries: int = 32,
        load_aware: bool = True,
        account_picks: bool = True,
    ):
        if preference is None:
            preference = DEFAULT_PREFERENCE
        if preference != KNEE and not (isinstance(preference, float | int) and 0.0 <= preference <= 1.0):
            raise ValueError(f"preference must be in [0, 1] or {KNEE!r}, got {preference!r}")
        if spread < 0 or max_entries < 1:
            raise ValueError(f"need spread >= 0 and max_entries >= 1, got {spread}, {max_entries}")
        self._pick_pref = None if preference == KNEE else float(preference)
        self.preference, self.spread = preference, spread
        self.config = replace(config or NsgaConfig(), seed=seed)
        self.background, self.max_entries = background, max_entries
        self.load_aware = load_aware
        self.account_picks = account_picks and load_aware  # idle costs ignore load, so picks too
        self._own = OwnPicks()
        self._idle = IdleChains()
        self._pools: dict[RouteRequest, Pool] = {}  # for the snapshot version below
        self._pools_version = -1
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._cache: OrderedDict[CacheKey, CachedFront] = OrderedDict()
        self._pending: set[CacheKey] = set()
        self._recent: OrderedDict[RequestClass, None] = OrderedDict()
        self._jobs: queue.Queue[tuple[CacheKey, SwarmView] | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self.stats = {"hits": 0, "misses": 0, "refreshes": 0, "rescored": 0}

    # -- decisions ----------------------------------------------------------------------------

    def choose(self, view: SwarmView, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Route:
        route = self._choose(view, request, exclude)
        if self.load_aware:  # routing.chains.idle_split: load picks the peers, idle costs the split
            route = self._idle_split(view, request, exclude, route)
        if self.account_picks:
            self._own.record(view.version, route)
        return route

    def release(self, route: Route) -> None:
        """A session routed on `route` ended: its peers are no longer loaded by it."""
        self._own.release(route)

    def _choose(self, view: SwarmView, request: RouteRequest, exclude: frozenset[str]) -> Route:
        key = (view.version, request_class(request))
        with self._lock:
            cached = self._cache.get(key)
        if cached is None and not self.background:
            cached = self.refresh(view, request)
        picks = self._own.counts(view.version) if self.account_picks else {}
        if cached is not None and picks:
            self.stats["rescored"] += 1
            return self._pick_loaded(cached, self._own.loaded(view, picks), request, exclude)
        if cached is not None:
            route = self._pick(cached, exclude, request_cache_tokens(request))
            if route is not None:
                self.stats["hits"] += 1
                return route
        else:
            self._schedule(view, key)
        self.stats["misses"] += 1
        return self._fallback(self._own.loaded(view, picks), request, exclude)

    def _idle_split(
        self, view: SwarmView, request: RouteRequest, exclude: frozenset[str], pick: Route
    ) -> Route:
        with self._lock:
            cached = self._cache.get((view.version, request_class(request)))
        idle = self._idle.route(view, request, exclude)
        loaded = self._own.loaded(view, self._own.counts(view.version) if self.account_picks else {})
        return keep_idle_split(pick, idle, loaded, request, cached.step_ms if cached else None)

    def _pick_loaded(
        self, cached: CachedFront, view: SwarmView, request: RouteRequest, exclude: frozenset[str]
    ) -> Route:
        """Picks among the cached front and this snapshot's exact solves, re-scored with this
        client's own picks added (routing.chains.own_picks, routing.chains.loaded_pool)."""
        with self._lock:
            if self._pools_version != view.version:
                self._pools, self._pools_version = {}, view.version
            pool = self._pools.setdefault(request, Pool(list(cached.front.routes), cached.step_ms))
        front = loaded_front(pool, view, request, exclude)
        return front.routes[self._draw(self._choices(front.latency_ms, front.throughput))]

    def _pick(self, cached: CachedFront, exclude: frozenset[str], need: int) -> Route | None:
        fits = cached.room >= need
        if not exclude and fits.all():
            return cached.front.routes[self._draw(cached.choices)]
        keep = fits & np.array([not (s & exclude) for s in cached.peer_sets])
        if not keep[cached.choices].any():
            return None  # every chain near the preferred one is excluded: solve again without them
        idx = np.flatnonzero(keep)
        lat, thr = cached.front.latency_ms[idx], cached.front.throughput[idx]
        return cached.front.routes[idx[self._draw(self._choices(lat, thr))]]

    def _choices(self, latency_ms: np.ndarray, throughput: np.ndarray) -> np.ndarray:
        at = pick_index(latency_ms, throughput, self._pick_pref)
        return neighbours(latency_ms, throughput, at, self.spread) if self.spread > 0 else np.array([at])

    def _draw(self, choices: np.ndarray) -> int:
        if len(choices) == 1:
            return int(choices[0])
        with self._lock:
            return int(choices[self._rng.integers(len(choices))])

    def _fallback(self, view: SwarmView, request: RouteRequest, exclude: frozenset[str]) -> Route:
        cands = self._candidates(view, request, exclude)
        hops = floor_route(cands, self._pick_pref)
        if hops is None:
            raise no_route_error(view, request, exclude, cands)
        return make_route(cands, hops)

    def _candidates(self, view: SwarmView, request: RouteRequest, exclude: frozenset[str] = frozenset()):
        """The problem as this router scores it: load-aware costs (routing.chains.load_costs) or idle ones."""
        return (load_aware_candidates if self.load_aware else candidates)(view, request, exclude)

    # -- the cache ----------------------------------------------------------------------------

    def refresh(self, view: SwarmView, request: RouteRequest) -> CachedFront | None:
        """Computes and caches the front for this snapshot and request class now (blocking)."""
        return self._refresh((view.version, request_class(request)), view)

    def _refresh(self, key: CacheKey, view: SwarmView) -> CachedFront | None:
        request, need = class_request(key[1]), class_cache_floor(key[1])
        step_ms = session_step_ms(view, request)
        cands = (
            load_aware_candidates(view, request, step_ms=step_ms, need=need)
            if self.load_aware
            else candidates(view, request, need=need)
        )
        front = nsga_front(cands, self.config)
        if len(front) == 0:
            return None
        room = {p.peer_id: p.cache_tokens_left for p in cands.peers}
        cached = CachedFront(
            front=front,
            peer_sets=tuple(frozenset(h.peer_id for h in r.hops) for r in front.routes),
            room=np.array([min(room[h.peer_id] for h in r.hops) for r in front.routes]),
            choices=self._choices(front.latency_ms, front.throughput),
            step_ms=step_ms,
        )
        with self._lock:
            self._cache[key] = cached
            self._cache.move_to_end(key)
            self._evict(view.version)
            self.stats["refreshes"] += 1
        return cached

    def cached_front(self, view: SwarmView, request: RouteRequest) -> Front | None:
        """The cached front for this snapshot and request class, if any."""
        with self._lock:
            cached = self._cache.get((view.version, request_class(request)))
        return None if cached is None else cached.front

    def _evict(self, newest: int) -> None:
        """Drops fronts of older snapshots, then the least recently stored beyond max_entries."""
        for key in [k for k in self._cache if k[0] < newest]:
            del self._cache[key]
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)

    def _schedule(self, view: SwarmView, key: CacheKey) -> None:
        """Queues this key and, for a new version, the classes seen lately (once each)."""
        with self._lock:
            self._recent[key[1]] = None
            self._recent.move_to_end(key[1])
            while len(self._recent) > 8:
                self._recent.popitem(last=False)
            keys = [(view.version, cls) for cls in self._recent]
            fresh = [k for k in keys if k not in self._pending and k not in self._cache]
            self._pending.update(fresh)
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="tradeoff-router", daemon=True)
                self._worker.start()
        for k in fresh:
            self._jobs.put((k, view))

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                self._jobs.task_done()
                return
            key, view = job
            try:
                if self._newest_pending_version() <= key[0]:  # skip snapshots already superseded
                    self._refresh(key, view)
            except Exception:  # a bad snapshot must not kill the worker; the next miss retries
                log.exception("front refresh failed for snapshot %d, class %s", key[0], key[1])
            finally:
                with self._lock:
                    self._pending.discard(key)
                self._jobs.task_done()

    def _newest_pending_version(self) -> int:
        with self._lock:
            return max((k[0] for k in self._pending), default=-1)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Blocks until no refresh is queued or running (for tests and benchmarks)."""
        done = threading.Event()
        threading.Thread(target=lambda: (self._jobs.join(), done.set()), daemon=True).start()
        return done.wait(timeout)

    def close(self) -> None:
        """Stops the worker thread (the router still answers, inline)."""
        self.background = False
        if self._worker is not None and self._worker.is_alive():
            self._jobs.put(None)
            self._worker.join(timeout=5.0)
