"""The cost of a chain of peers, shared by every chain router (pure, no I/O).

Petals' `find_best_chain` (Explorative Study, §II-A, Algorithm 1 of its ref. [5]) weighs a server by
its compute time plus the client's ping to it; the study's NSGA-II (§II-B3) adds the servers'
compute throughput as a second objective. Both become, per hop on a client-relayed chain:

    latency_ms(hop)     = rtt(client, peer) + transfer(hidden states, both ways)
                          + decode_ms_per_block(peer) * blocks(hop)
    throughput(peer)    = throughput(peer) / (blocks the chain runs on it * (1 + open_sessions))

A chain's latency is the sum over its hops (ms per decode step), plus, where peers measured
the links a pushed chain crosses between them, what those links cost more or less than the
client relaying (routing/chains/peer_links.py); its throughput is the bottleneck, the smallest per-peer throughput (tokens/s after the current load is shared
out). The solvers bound each hop by the floor; a chain that comes back to a peer after
another peer (never useful for latency, rare) is still scored by the peer's total blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hexswarm.routing.chains.peer_links import follow_matrix
from hexswarm.routing.chains.swarm_view import Hop, NoRouteError, PeerView, Route, RouteRequest, SwarmView

# An unmeasured peer is assumed to be this far away: still usable, but measured ones win.
DEFAULT_RTT_MS = 100.0


def request_cache_tokens(request: RouteRequest) -> int:
    """KV-cache tokens a session of `request` takes on every peer of its chain."""
    return request.batch_size * (request.prompt_tokens + request.new_tokens)


def validate_request(request: RouteRequest) -> None:
    """Raises ValueError when a request cannot be routed as given."""
    if request.prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be >= 1, got {request.prompt_tokens}")
    if request.new_tokens < 0:
        raise ValueError(f"new_tokens must be >= 0, got {request.new_tokens}")
    if request.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {request.batch_size}")


def validate_view(view: SwarmView) -> None:
    """Raises ValueError on a malformed snapshot (the client builds it; records are checked here too)."""
    if view.num_blocks < 1:
        raise ValueError(f"num_blocks must be >= 1, got {view.num_blocks}")
    if not view.client_bandwidth_mbps > 0:
        raise ValueError(f"client_bandwidth_mbps must be > 0, got {view.client_bandwidth_mbps}")
    if view.hidden_size < 0 or view.dtype_bytes < 1:
        raise ValueError(f"bad hidden_size/dtype_bytes: {view.hidden_size}/{view.dtype_bytes}")
    for peer in view.peers:
        _validate_peer(peer, view.num_blocks)


def _validate_peer(peer: PeerView, num_blocks: int) -> None:
    if not 0 <= peer.start < peer.end <= num_blocks:
        raise ValueError(f"peer {peer.peer_id}: range [{peer.start}, {peer.end}) not in [0, {num_blocks})")
    if not (math.isfinite(peer.throughput) and peer.throughput > 0):
        raise ValueError(f"peer {peer.peer_id}: throughput must be > 0, got {peer.throughput}")
    if not (math.isfinite(peer.decode_ms_per_block) and peer.decode_ms_per_block >= 0):
        raise ValueError(f"peer {peer.peer_id}: bad decode_ms_per_block {peer.decode_ms_per_block}")
    if peer.open_sessions < 0:
        raise ValueError(f"peer {peer.peer_id}: open_sessions must be >= 0, got {peer.open_sessions}")
    if peer.decode_batch_size < 1:
        raise ValueError(f"peer {peer.peer_id}: decode_batch_size must be >= 1, got {peer.decode_batch_size}")
    if not (math.isfinite(peer.decode_batch_tokens_per_s) and peer.decode_batch_tokens_per_s >= 0):
        raise ValueError(
            f"peer {peer.peer_id}: bad decode_batch_tokens_per_s {peer.decode_batch_tokens_per_s}"
        )


def transfer_ms(view: SwarmView, request: RouteRequest, tokens_per_row: int = 1) -> float:
    """ms to send one step's hidden states to a peer and get them back (B x T x H, both ways)."""
    nbytes = request.batch_size * tokens_per_row * view.hidden_size * view.dtype_bytes
    return 2 * nbytes * 8 / (view.client_bandwidth_mbps * 1e3)  # bits / (bits per ms)


@dataclass(frozen=True)
class Candidates:
    """The eligible peers of one routing problem as arrays (n = eligible peers).

    Every array is indexed by candidate number; `peers[i]` is the PeerView behind it.
    """

    peers: tuple[PeerView, ...]
    num_blocks: int
    start: np.ndarray  # (n,) int, first block served
    end: np.ndarray  # (n,) int, one past the last block served
    overhead_ms: np.ndarray  # (n,) round trip + transfer, paid once per hop
    decode_ms: np.ndarray  # (n,) compute per block per decode step
    capacity: np.ndarray  # (n,) tokens/s of one block after the current load is shared out
    # (n, n) ms added when a hop on i follows one on j (peer_links.py); None: no link measured
    follow_ms: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.peers)

    def serves(self) -> np.ndarray:
        """(n, num_blocks) bool: candidate i serves block b."""
        blocks = np.arange(self.num_blocks)
        return (self.start[:, None] <= blocks) & (blocks < self.end[:, None])


def candidates(
    view: SwarmView, request: RouteRequest, exclude: frozenset[str] = frozenset(), need: int | None = None
) -> Candidates:
    """Peers that may carry `request`: not excluded, with cache for its tokens (first record per id).

    need: the cache tokens a peer must have left (default: what `request` takes).
    """
    validate_view(view)
    validate_request(request)
    need = request_cache_tokens(request) if need is None else need
    seen: set[str] = set()
    chosen: list[PeerView] = []
    for peer in view.peers:
        if peer.peer_id in exclude or peer.peer_id in seen or peer.cache_tokens_left < need:
            continue
        seen.add(peer.peer_id)
        chosen.append(peer)
    per_hop = transfer_ms(view, request)
    rtt = [view.client_rtt_ms.get(p.peer_id, DEFAULT_RTT_MS) for p in chosen]
    return Candidates(
        peers=tuple(chosen),
        num_blocks=view.num_blocks,
        start=np.array([p.start for p in chosen], dtype=np.int64),
        end=np.array([p.end for p in chosen], dtype=np.int64),
        overhead_ms=np.array(rtt, dtype=float) + per_hop,
        decode_ms=np.array([p.decode_ms_per_block for p in chosen], dtype=float),
        capacity=np.array([p.throughput / (1 + p.open_sessions) for p in chosen], dtype=float),
        follow_ms=follow_matrix([p.peer_id for p in chosen], rtt, view.peer_rtt_ms),
    )


def missing_blocks(cands: Candidates) -> list[int]:
    """Blocks that no candidate serves (empty when some chain covers the model)."""
    covered = np.zeros(cands.num_blocks, dtype=bool)
    for s, e in zip(cands.start, cands.end, strict=True):
        covered[s:e] = True
    return [int(b) for b in np.flatnonzero(~covered)]


def no_route_error(
    view: SwarmView, request: RouteRequest, exclude: frozenset[str], cands: Candidates
) -> NoRouteError:
    """The NoRouteError for a problem whose candidates leave blocks uncovered."""
    missing = missing_blocks(cands)
    need = request_cache_tokens(request)
    short = sum(1 for p in view.peers if p.cache_tokens_left < need and p.peer_id not in exclude)
    excluded = sum(1 for p in view.peers if p.peer_id in exclude)
    return NoRouteError(
        missing,
        f"no eligible peer serves blocks {_ranges(missing)} "
        f"({excluded} peers excluded, {short} without cache for {need} tokens)",
    )


def _ranges(blocks: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    runs: list[list[int]] = []
    for b in blocks:
        if runs and b == runs[-1][1] + 1:
            runs[-1][1] = b
        else:
            runs.append([b, b])
    return ", ".join(str(a) if a == z else f"{a}-{z}" for a, z in runs)


def hop_latency_ms(cands: Candidates, i: int, start: int, end: int) -> float:
    """Latency of running blocks [start, end) on candidate i."""
    return float(cands.overhead_ms[i] + cands.decode_ms[i] * (end - start))


def follow_ms(cands: Candidates, before: int, after: int) -> float:
    """ms added when a hop on candidate `after` follows one on `before` (0: no measured link)."""
    return 0.0 if cands.follow_ms is None else float(cands.follow_ms[before, after])


def make_route(cands: Candidates, hops: list[tuple[int, int, int]]) -> Route:
    """Builds a Route from (candidate, start, end) hops, with its latency and bottleneck throughput."""
    latency = sum(hop_latency_ms(cands, i, s, e) for i, s, e in hops)
    latency += sum(follow_ms(cands, j, i) for (j, _, _), (i, _, _) in zip(hops, hops[1:], strict=False))
    blocks: dict[int, int] = {}
    for i, s, e in hops:
        blocks[i] = blocks.get(i, 0) + e - s
    return Route(
        hops=tuple(Hop(cands.peers[i].peer_id, s, e) for i, s, e in hops),
        latency_ms=latency,
        throughput=min(float(cands.capacity[i]) / k for i, k in blocks.items()),
    )


def route_from_assignment(cands: Candidates, assign: np.ndarray) -> Route:
    """Route of a per-block assignment (candidate index per block); equal neighbours merge into one hop."""
    hops: list[tuple[int, int, int]] = []
    for b, i in enumerate(assign.tolist()):
        if hops and hops[-1][0] == i:
            hops[-1] = (i, hops[-1][1], b + 1)
        else:
            hops.append((i, b, b + 1))
    return make_route(cands, hops)


def evaluate_assignments(cands: Candidates, assign: np.ndarray) -> np.ndarray:
    """(pop, 2) objectives [latency_ms, -throughput] of (pop, L) per-block candidate indices."""
    pop, num_blocks = assign.shape
    starts = np.ones_like(assign, dtype=bool)  # block b opens a new hop
    starts[:, 1:] = assign[:, 1:] != assign[:, :-1]
    latency = cands.decode_ms[assign].sum(axis=1) + (cands.overhead_ms[assign] * starts).sum(axis=1)
    if cands.follow_ms is not None:  # each hop after the first pays its link from the hop before
        links = cands.follow_ms[assign[:, :-1], assign[:, 1:]]
        latency += np.where(starts[:, 1:], links, 0.0).sum(axis=1)
    per_peer = np.zeros((pop, cands.size), dtype=np.int64)  # blocks each peer runs per chain
    np.add.at(per_peer, (np.arange(pop)[:, None], assign), 1)
    throughput = (cands.capacity[assign] / np.take_along_axis(per_peer, assign, axis=1)).min(axis=1)
    return np.column_stack([latency, -throughput])
