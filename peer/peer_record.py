"""What a running peer announces about itself: its DHT record, built from what it serves
(peer/serving.py), how it is reached, its limits and where the plan is moving it."""

from __future__ import annotations

from hexswarm import swarm
from hexswarm.swarm.trust.records import PeerRecord, PeerState
from hexswarm.swarm.wire.tensors import DTYPE_NAMES


def peer_record(peer, state: PeerState) -> PeerRecord:
    """The record `peer` (peer/runtime.py's _Peer) announces in `state`: what it serves and how
    fast, how to reach it, its limits, and where the plan is moving it."""
    c, serving = peer.config, peer.serving
    decode_batch = serving.decode_batch if serving else (1, 0.0)
    next_range = peer.mover.next_range
    return PeerRecord(
        peer_id=peer.identity.peer_id.to_base58(),
        name=peer.name,
        model_id=c.spec.model_id,
        start=peer.start,
        end=peer.end,
        state=state,
        throughput=peer.throughput[0],
        decode_ms_per_block=peer.throughput[1],
        decode_batch_size=decode_batch[0],
        decode_batch_tokens_per_s=decode_batch[1],
        cache_tokens_left=peer.core.session_cache_tokens_left if peer.core else 0,
        open_sessions=len(peer.core.sessions) if peer.core else 0,
        max_length=c.limits.max_length,
        dtype=DTYPE_NAMES.get(c.dtype, str(c.dtype)),
        device=",".join(str(d) for d in c.devices),
        version=swarm.__version__,
        addrs=peer.reach.addrs,
        reachability=peer.reach.mode,
        relays=peer.reach.relays,
        tp=peer.tp,
        devices=peer.device_info[: peer.tp],
        tp_choices=c.tp_choices,
        tp_speeds=tuple((tp, *speed) for tp, speed in serving.speeds) if serving else (),
        quant=c.quant,
        weight_bytes_per_block=serving.weight_bytes if serving else 0,
        role=peer.role,
        **_partition_fields(peer),
        region=c.region,
        rtt_ms=peer.probe.published(),
        auto=c.auto,
        max_blocks=c.max_blocks,
        plan_version=peer.follower.followed if peer.follower else 0,
        next_start=next_range[0] if next_range else 0,
        next_end=next_range[1] if next_range else 0,
    )


def _partition_fields(peer) -> dict:
    """The record's tp_* fields of an uneven split (nothing for an even one)."""
    group = peer.group
    if group is None or group.partition is None or group.repartitioner is None:
        return {}
    partition, config = group.partition, peer.config.spec.config
    return {
        "tp_partition": group.split.mode,
        "tp_shares": tuple(zip(partition.heads(config), partition.mlp_columns, strict=True)),
        "tp_predicted_step_ms": group.predicted_step_s() * 1000,
        "tp_observed_step_ms": group.observed_step_s * 1000,
        "tp_repartitions": group.repartitions,
    }
