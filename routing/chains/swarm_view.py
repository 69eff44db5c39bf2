"""Plain-data view of a swarm, as the chain routers see it (no I/O, no torch).

The client builds a `SwarmView` from DHT records plus its own measured round trips and
asks a router for a `Route`: an ordered chain of hops that covers blocks [0, num_blocks).

Transport assumed by the cost of a hop (what the client does today): the client sends a
step to a peer and gets the result back, then sends it to the next peer (client-relayed).
So one hop costs the client<->peer round trip, the transfer of the hidden states both ways,
and the peer's compute for its blocks. When peers push steps to each other, `peer_rtt_ms`
holds the links they measured, and a chain pays those instead (routing/chains/peer_links.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class PeerView:
    """One peer serving the contiguous blocks [start, end) of a model."""

    peer_id: str
    start: int
    end: int
    throughput: float  # tokens/s one block of this peer processes in a batched prefill (compute capacity)
    decode_ms_per_block: float  # ms for one decode step (one token) through one block
    cache_tokens_left: int  # KV-cache tokens (summed over the batch) it can still give a new session
    open_sessions: int = 0  # current load
    # Decode when the peer batches the steps of many sessions into one forward (peer/scheduler.py): tokens/s
    # through one block with `decode_batch_size` sessions stepping together. 0: not announced,
    # read as one session at a time (1000 / decode_ms_per_block).
    decode_batch_size: int = 1
    decode_batch_tokens_per_s: float = 0.0

    def decode_tokens_per_s(self) -> float:
        """Decode tokens/s through one block when the peer is saturated: batched, or one at a time."""
        if self.decode_batch_tokens_per_s > 0:
            return self.decode_batch_tokens_per_s
        return 1e3 / self.decode_ms_per_block if self.decode_ms_per_block > 0 else float("inf")

    def step_ms_per_block(self, sessions: int) -> float:
        """ms per block of one decode step of `sessions` sessions together (roofline of the announced figures).

        A step reads the block's weights once (decode_ms_per_block) however many sessions it
        carries, and cannot beat the announced batched rate: max(d, 1000 * sessions / rate).
        A peer that does not batch announces rate = 1000 / d, so k sessions take k steps.
        """
        return max(self.decode_ms_per_block, 1e3 * max(sessions, 1) / self.decode_tokens_per_s())


@dataclass(frozen=True)
class SwarmView:
    """What a client knows of the swarm of one model at one moment."""

    num_blocks: int
    peers: tuple[PeerView, ...]
    client_rtt_ms: dict[str, float] = field(default_factory=dict)  # peer_id -> client<->peer round trip
    # (a, b) with a <= b (peer_links.pair) -> a<->b round trip, as the peers measured it
    peer_rtt_ms: dict[tuple[str, str], float] = field(default_factory=dict)
    client_bandwidth_mbps: float = 1000.0  # client<->peer link, for the transfer of hidden states
    hidden_size: int = 0  # for the transfer size of one token's hidden state
    dtype_bytes: int = 4
    version: int = 0  # bumped by whoever builds views when the snapshot changes


@dataclass(frozen=True)
class RouteRequest:
    """The request a route is chosen for."""

    prompt_tokens: int
    new_tokens: int
    batch_size: int = 1


@dataclass(frozen=True)
class Hop:
    """Run blocks [start, end) on one peer. start/end may be a sub-range of what the peer serves."""

    peer_id: str
    start: int
    end: int


@dataclass(frozen=True)
class Route:
    """An ordered chain of hops covering [0, num_blocks), with the estimate it was chosen by."""

    hops: tuple[Hop, ...]
    latency_ms: float  # estimated ms per decode step (one token) end to end
    throughput: float  # estimated tokens/s the chain sustains after current load (its bottleneck)


class NoRouteError(RuntimeError):
    """No chain of eligible peers covers every block; `missing_blocks` names the uncovered ones."""

    def __init__(self, missing_blocks: list[int], message: str | None = None):
        self.missing_blocks = missing_blocks
        super().__init__(message or f"no peer serves blocks {missing_blocks}")


class Router(Protocol):
    """The one interface the client routes through."""

    def choose(self, view: SwarmView, request: RouteRequest, exclude: frozenset[str] = frozenset()) -> Route:
        """Returns a route that avoids the peers in `exclude`, or raises NoRouteError."""
        ...
