"""What a peer is started with: every `run-peer` flag, as one frozen value (peer/cli.py builds it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hexswarm.peer.admission import AdmissionLimits
from hexswarm.peer.core import PeerLimits
from hexswarm.peer.faults import FaultPlan
from hexswarm.peer.scheduler import BatchPolicy
from hexswarm.swarm.coordinator.records import Trust
from hexswarm.swarm.models.model_spec import ModelSpec
from hexswarm.swarm.nat.port_relay import RelayLimits


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
    partition: str = "even"  # how a group splits each layer: even, or auto (Hepti's LP; tp/partition.py)
    slowdowns: dict = field(default_factory=dict)  # benchmark only: rank -> Slowdown (tp/profile.py)
    # The coordinator (peer/plan_follower.py, swarm/coordinator/): an auto peer's range is chosen
    # on join and moved by the plan or by Petals' rule; a fixed peer is never moved.
    auto: bool = False
    # --layers auto --tp auto: the degrees the plan may choose among (peer/tp/group.py serves a
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
