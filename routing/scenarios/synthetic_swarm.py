"""Seeded synthetic swarms for router tests and benchmarks (pure, no I/O).

Heterogeneous on purpose: GPU tiers from datacenter cards to CPUs, random contiguous layer
ranges, and client round trips from a few ms (same city) to ~200 ms (another continent).
The first peers tile [0, num_blocks) so that a chain always exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from hexswarm.routing.chains.swarm_view import PeerView, SwarmView


@dataclass(frozen=True)
class Tier:
    """One kind of device: speed of one block and how many blocks it can hold."""

    name: str
    decode_ms_per_block: float  # ms per decode step per block (memory bound)
    throughput: float  # tokens/s per block in a batched prefill (compute bound)
    max_blocks: int  # layers of a 70B-class model that fit
    weight: float  # how common it is in the swarm


# Llama-70B-class block (~0.85 B params, fp16): decode reads 1.7 GB of weights per step
# (ms = 1.7 GB / memory bandwidth); prefill does ~1.7 GFLOP per token (tokens/s = FLOP/s / that,
# at ~60% of peak). Rough, but the spread between tiers is what the routers see.
TIERS = (
    Tier("h100", 0.60, 150000.0, 40, 0.10),
    Tier("a100", 0.90, 60000.0, 32, 0.15),
    Tier("rtx4090", 1.70, 50000.0, 10, 0.30),
    Tier("rtx3090", 1.80, 25000.0, 10, 0.25),
    Tier("t4", 5.50, 10000.0, 6, 0.12),
    Tier("cpu", 35.00, 300.0, 16, 0.08),
)


@dataclass(frozen=True)
class SwarmSpec:
    """Knobs of a synthetic swarm."""

    num_peers: int
    num_blocks: int = 80
    seed: int = 0
    hidden_size: int = 8192
    dtype_bytes: int = 2
    client_bandwidth_mbps: float = 100.0
    cache_tokens: tuple[int, int] = (4096, 65536)  # range of cache tokens left per peer
    # "balanced": a joining peer takes the window of blocks with the least throughput so far
    # (Petals' rule, what auto peers do without a coordinator); "uniform": a random window,
    # which leaves the first and last blocks to a few peers (the edge of every window).
    placement: str = "balanced"
    # True: peers batch the decode steps of many sessions (peers batch decode steps), as routing.sim.load_sim
    # runs them, and announce it; False: they decode one session at a time, and say so.
    batching: bool = True


def _tier_of(rng: np.random.Generator) -> Tier:
    weights = np.array([t.weight for t in TIERS])
    return TIERS[int(rng.choice(len(TIERS), p=weights / weights.sum()))]


def _peer(
    rng: np.random.Generator, spec: SwarmSpec, index: int, start: int | None, coverage: np.ndarray
) -> PeerView:
    tier = _tier_of(rng)
    length = int(rng.integers(max(1, tier.max_blocks // 2), tier.max_blocks + 1))
    length = min(length, spec.num_blocks)
    if start is None and spec.placement == "balanced":
        window = np.convolve(coverage, np.ones(length), mode="valid")  # (L - length + 1,) sums
        start = int(np.argmin(window))
    elif start is None:
        start = int(rng.integers(0, spec.num_blocks - length + 1))
    end = min(spec.num_blocks, start + length)
    jitter = float(rng.uniform(0.8, 1.25))  # same card, different host
    throughput, decode_ms = tier.throughput / jitter, tier.decode_ms_per_block * jitter
    return PeerView(
        peer_id=f"p{index:04d}",
        start=start,
        end=end,
        throughput=throughput,
        decode_ms_per_block=decode_ms,
        cache_tokens_left=int(rng.integers(spec.cache_tokens[0], spec.cache_tokens[1] + 1)),
        **(_batched_decode(throughput, decode_ms) if spec.batching else {}),
    )


def _batched_decode(throughput: float, decode_ms: float) -> dict:
    """What a batching peer announces: its decode rate at the batch where compute takes over
    from reading the weights (one step costs max(d, 1000 k / throughput), as load_sim runs it)."""
    batch = max(1, math.ceil(decode_ms * throughput / 1e3))
    return {"decode_batch_size": batch, "decode_batch_tokens_per_s": throughput}


def generate_swarm(spec: SwarmSpec) -> SwarmView:
    """Exactly `spec.num_peers` peers; the first ones tile every block (so a chain exists)."""
    if spec.num_peers < 1 or spec.num_blocks < 1:
        raise ValueError(f"need >= 1 peer and >= 1 block, got {spec.num_peers}, {spec.num_blocks}")
    if spec.placement not in ("balanced", "uniform"):
        raise ValueError(f"placement must be 'balanced' or 'uniform', got {spec.placement!r}")
    rng = np.random.default_rng(spec.seed)
    peers: list[PeerView] = []
    coverage = np.zeros(spec.num_blocks)  # throughput serving each block so far
    covered = 0
    while covered < spec.num_blocks or len(peers) < spec.num_peers:
        tiling = covered < spec.num_blocks
        peer = _peer(rng, spec, len(peers), covered if tiling else None, coverage)
        if tiling and len(peers) == spec.num_peers - 1:  # last slot: stretch it over the rest
            peer = replace(peer, end=spec.num_blocks)
        covered = max(covered, peer.end) if tiling else covered
        coverage[peer.start : peer.end] += peer.throughput
        peers.append(peer)
    # Round trips: log-uniform 5..200 ms, so a few peers are close and most are not.
    rtt = np.exp(rng.uniform(np.log(5.0), np.log(200.0), size=len(peers)))
    return SwarmView(
        num_blocks=spec.num_blocks,
        peers=tuple(peers),
        client_rtt_ms={p.peer_id: float(r) for p, r in zip(peers, rtt, strict=True)},
        client_bandwidth_mbps=spec.client_bandwidth_mbps,
        hidden_size=spec.hidden_size,
        dtype_bytes=spec.dtype_bytes,
    )
