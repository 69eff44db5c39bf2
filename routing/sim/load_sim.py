"""Discrete-event load test of chain routers: many clients, one swarm (pure, no I/O).

Why simulate: a router's estimate ignores the other clients, and the Explorative Study on distributed LLM computing
(§II-B5) could not run the multi-client experiment for lack of a private swarm. Here:

- requests arrive as a Poisson process; each is routed on the client's snapshot, which is
  refreshed every `refresh_ms` (peers re-announce load and free cache periodically, so
  every client routes on stale data in between);
- opening a session takes KV cache on every peer of the chain; a peer without room
  refuses and the client re-routes without it (`exclude`); a request no chain can take
  waits for a session to close;
- each step (the prefill, then one per new token) runs hop by hop, client-relayed: half a
  round trip plus the transfer out, queueing at the peer, compute, and back;
- a peer serves concurrently by continuous batching: it runs everything queued as one
  iteration that lasts max(reading weights, computing), i.e. max over items of
  decode_ms_per_block * blocks and sum over items of tokens * blocks / rate, with the
  prefill rate (throughput) for prompts and the announced decode rate
  (PeerView.decode_tokens_per_s) for generated tokens: a peer that does not batch
  (rate 1000 / decode_ms_per_block) runs k decode steps in k times one step's time.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import optimize, sparse

from hexswarm.routing.chains.cost import DEFAULT_RTT_MS, request_cache_tokens
from hexswarm.routing.chains.min_latency import min_latency_route
from hexswarm.routing.chains.swarm_view import NoRouteError, PeerView, Router, RouteRequest, SwarmView


@dataclass(frozen=True)
class LoadSpec:
    """The workload of one load test."""

    num_requests: int = 1000
    rate_per_s: float = 5.0  # Poisson arrival rate
    request: RouteRequest = RouteRequest(prompt_tokens=128, new_tokens=32)
    refresh_ms: float = 1000.0  # how often clients get a fresh snapshot
    max_reroutes: int = 8
    seed: int = 0


@dataclass(frozen=True)
class LoadResult:
    """What one router achieved under one workload."""

    mean_latency_s: float
    p99_latency_s: float
    tokens_per_s: float  # generated tokens over the span from first arrival to last finish
    completed: int
    mean_hops: float


@dataclass
class _Session:
    arrival: float
    hops: list[tuple[int, int, int]] = field(default_factory=list)  # (peer index, start, end)
    step: int = 0  # 0 = prefill, then one per new token
    hop: int = 0


class _Sim:
    def __init__(self, view: SwarmView, router: Router, spec: LoadSpec):
        self.view, self.router, self.spec = view, router, spec
        self.index = {p.peer_id: i for i, p in enumerate(view.peers)}
        self.rtt = np.array([view.client_rtt_ms.get(p.peer_id, DEFAULT_RTT_MS) for p in view.peers])
        self.open = np.zeros(len(view.peers), dtype=np.int64)
        self.cache = np.array([p.cache_tokens_left for p in view.peers], dtype=np.int64)
        self.queue: list[list[tuple[_Session, int]]] = [[] for _ in view.peers]
        self.busy = np.zeros(len(view.peers), dtype=bool)
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.waiting: list[_Session] = []
        self.need = request_cache_tokens(spec.request)
        self.snapshot = view
        self.latencies: list[float] = []
        self.hop_counts: list[int] = []
        self.last_finish = 0.0

    def push(self, t: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def one_way_ms(self, peer: int, step: int) -> float:
        rows = self.spec.request.batch_size * (self.spec.request.prompt_tokens if step == 0 else 1)
        bits = rows * self.view.hidden_size * self.view.dtype_bytes * 8
        return self.rtt[peer] / 2 + bits / (self.view.client_bandwidth_mbps * 1e3)

    def take_snapshot(self) -> None:
        peers = tuple(
            replace(p, open_sessions=int(self.open[i]), cache_tokens_left=int(self.cache[i]))
            for i, p in enumerate(self.view.peers)
        )
        self.snapshot = replace(self.view, peers=peers, version=self.snapshot.version + 1)

    def try_open(self, t: float, s: _Session) -> bool:
        exclude: set[str] = set()
        for _ in range(self.spec.max_reroutes):
            try:
                route = self.router.choose(self.snapshot, self.spec.request, frozenset(exclude))
            except NoRouteError:
                return False
            hops = [(self.index[h.peer_id], h.start, h.end) for h in route.hops]
            peers = {i for i, _, _ in hops}
            full = {self.view.peers[i].peer_id for i in peers if self.cache[i] < self.need}
            if not full:
                for i in peers:
                    self.cache[i] -= self.need
                    self.open[i] += 1
                s.hops = hops
                self.push(t + self.one_way_ms(hops[0][0], 0), "arrive", s)
                return True
            exclude |= full
        return False

    def arrive(self, t: float, s: _Session) -> None:
        peer = s.hops[s.hop][0]
        self.queue[peer].append((s, s.hop))
        if not self.busy[peer]:
            self.start_iteration(t, peer)

    def start_iteration(self, t: float, peer: int) -> None:
        items, self.queue[peer] = self.queue[peer], []
        p: PeerView = self.view.peers[peer]
        batch = self.spec.request.batch_size
        blocks = [s.hops[h][2] - s.hops[h][1] for s, h in items]
        prefill = sum(k for k, (s, _) in zip(blocks, items, strict=True) if s.step == 0)
        weights_ms = p.decode_ms_per_block * max(blocks)
        compute_ms = (
            1e3
            * batch
            * (
                prefill * self.spec.request.prompt_tokens / p.throughput
                + (sum(blocks) - prefill) / p.decode_tokens_per_s()
            )
        )
        self.busy[peer] = True
        self.push(t + max(weights_ms, compute_ms), "done", (peer, items))

    def done(self, t: float, peer: int, items: list[tuple[_Session, int]]) -> None:
        self.busy[peer] = False
        for s, _ in items:
            back = t + self.one_way_ms(peer, s.step)
            s.hop += 1
            if s.hop == len(s.hops):
                s.hop, s.step = 0, s.step + 1
                if s.step > self.spec.request.new_tokens:
                    self.finish(back, s)
                    continue
            self.push(back + self.one_way_ms(s.hops[s.hop][0], s.step), "arrive", s)
        if self.queue[peer]:
            self.start_iteration(t, peer)

    def finish(self, t: float, s: _Session) -> None:
        for i in {i for i, _, _ in s.hops}:
            self.cache[i] += self.need
            self.open[i] -= 1
        self.latencies.append((t - s.arrival) / 1e3)
        self.hop_counts.append(len(s.hops))
        self.last_finish = max(self.last_finish, t)
        while self.waiting and self.try_open(t, self.waiting[0]):  # first come, first served
            self.waiting.pop(0)

    def run(self) -> LoadResult:
        rng = np.random.default_rng(self.spec.seed)
        gaps = rng.exponential(1e3 / self.spec.rate_per_s, size=self.spec.num_requests)
        for t in np.cumsum(gaps) - gaps[0]:
            self.push(float(t), "request", _Session(arrival=float(t)))
        self.push(self.spec.refresh_ms, "snapshot")
        pending = self.spec.num_requests
        while self.events and len(self.latencies) < pending:
            t, _, kind, payload = heapq.heappop(self.events)
            if kind == "request" and (self.waiting or not self.try_open(t, payload)):
                self.waiting.append(payload)
            elif kind == "arrive":
                self.arrive(t, payload)
            elif kind == "done":
                self.done(t, *payload)
            elif kind == "snapshot":
                self.take_snapshot()
                if self.events:  # nothing else pending: nothing left that a snapshot could help
                    self.push(t + self.spec.refresh_ms, "snapshot")
        return self.result()

    def result(self) -> LoadResult:
        lat = np.array(self.latencies)
        tokens = len(lat) * self.spec.request.new_tokens * self.spec.request.batch_size
        return LoadResult(
            mean_latency_s=float(lat.mean()) if lat.size else float("nan"),
            p99_latency_s=float(np.percentile(lat, 99)) if lat.size else float("nan"),
            tokens_per_s=tokens / (self.last_finish / 1e3) if self.last_finish > 0 else 0.0,
            completed=len(lat),
            mean_hops=float(np.mean(self.hop_counts)) if self.hop_counts else 0.0,
        )


def compute_capacity(view: SwarmView, request: RouteRequest) -> float:
    """Most requests/s the swarm can push through every block, by compute (an LP; 0.0 if a block is unserved).

    Each peer splits its time among its blocks: x[i, b] requests/s of block b on peer i, each
    taking sec_i = batch * (prompt / throughput_i + new / decode rate_i) seconds of it, so
    sum_b x[i, b] * sec_i <= 1, and every block gets sum_i x[i, b] >= T; maximise T. This
    is the rate at which the simulator's peers, always compute bound, would all be busy. The
    sum of rates / blocks overstates it when few or slow peers serve some blocks.
    """
    pairs = [(i, b) for i, p in enumerate(view.peers) for b in range(p.start, p.end)]
    if not pairs:
        return 0.0
    peer_of, block_of = np.array(pairs).T
    sec = np.array(
        [
            request.batch_size
            * (request.prompt_tokens / p.throughput + request.new_tokens / p.decode_tokens_per_s())
            for p in view.peers
        ]
    )
    nvar = len(pairs) + 1  # the x's, then T
    cols = np.arange(len(pairs))
    rows = np.concatenate([block_of, view.num_blocks + peer_of, np.arange(view.num_blocks)])
    cols = np.concatenate([cols, cols, np.full(view.num_blocks, len(pairs))])
    vals = np.concatenate([-np.ones(len(pairs)), sec[peer_of], np.ones(view.num_blocks)])
    a_ub = sparse.csr_array((vals, (rows, cols)), shape=(view.num_blocks + len(view.peers), nvar))
    b_ub = np.concatenate([np.zeros(view.num_blocks), np.ones(len(view.peers))])
    cost = np.zeros(nvar)
    cost[-1] = -1.0
    res = optimize.linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
    return float(res.x[-1]) if res.status == 0 else 0.0


def sustainable_rate(view: SwarmView, request: RouteRequest) -> float:
    """Requests/s the swarm could serve at best: the lower of its compute and its KV-cache bound.

    Compute: compute_capacity. Cache: by Little's law a block can hold
    (sum of its peers' free cache / a session's need) sessions, each lasting at least
    (new + 1) idle steps of the exact min-latency chain; the scarcest block sets the bound.
    Both are optimistic, so a load of 1.0 is already more than any router can carry.
    """
    need = request_cache_tokens(request)
    per_block = np.zeros(view.num_blocks)
    for p in view.peers:
        per_block[p.start : p.end] += p.cache_tokens_left // need
    session_s = (request.new_tokens + 1) * min_latency_route(view, request).latency_ms / 1e3
    return float(min(compute_capacity(view, request), per_block.min() / session_s))


def simulate_load(view: SwarmView, router: Router, spec: LoadSpec) -> LoadResult:
    """Runs `spec` on `view` with every request routed by `router`; see the module docstring."""
    if spec.num_requests < 1 or not spec.rate_per_s > 0 or not spec.refresh_ms > 0:
        raise ValueError(f"bad load spec: {spec}")
    return _Sim(view, router, spec).run()
