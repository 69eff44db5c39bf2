"""What a running peer announces about itself: its DHT record, built from what it serves
(peer/serving.py), how it is reached, its limits and where the plan is moving it.

The record is built from a `RecordSource`, the values read at the moment of announcing
(peer/runtime.py gathers them), so this module depends on no running peer and a test builds
a record from plain values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hexswarm import swarm
from hexswarm.peer.config import PeerConfig
from hexswarm.peer.reachability import Reach
from hexswarm.peer.serving import Serving
from hexswarm.swarm.trust.records import PeerRecord, PeerState
from hexswarm.swarm.wire.tensors import DTYPE_NAMES

if TYPE_CHECKING:
    from hexswarm.peer.tp.group import TPGroup


@dataclass(frozen=True)
class RecordSource:
    """What a record is built from, as it is when the peer announces."""

    config: PeerConfig
    peer_id: str
    name: str
    serving: Serving | None  # None before its blocks have loaded: the config's range and degree
    reach: Reach
    role: str  # the role it announces (an auto peer's: its plan's)
    device_info: tuple  # its devices, described (peer/devices.py)
    group: TPGroup | None  # its TPGroup with --tp K: an uneven split's figures are announced
    next_range: tuple[int, int] | None  # the range a move is loading
    links: tuple[tuple[str, float], ...]  # round trips to its nearest peers, by tag (peer/link_probe.py)
    plan_version: int  # the coordinator's plan it follows (0: none)
    relay_slots_free: int = -1  # slots its relay would still give (-1: it relays for no one)


def peer_record(source: RecordSource, state: PeerState) -> PeerRecord:
    """The record a peer announces in `state`: what it serves and how fast, how to reach it,
    its limits, and where the plan is moving it."""
    c, serving, next_range = source.config, source.serving, source.next_range
    start, end, tp = (serving.start, serving.end, serving.tp) if serving else (c.start, c.end, c.tp)
    throughput = serving.throughput if serving else (0.0, 0.0)
    decode_batch = serving.decode_batch if serving else (1, 0.0)
    return PeerRecord(
        peer_id=source.peer_id,
        name=source.name,
        model_id=c.spec.model_id,
        start=start,
        end=end,
        state=state,
        throughput=throughput[0],
        decode_ms_per_block=throughput[1],
        decode_batch_size=decode_batch[0],
        decode_batch_tokens_per_s=decode_batch[1],
        cache_tokens_left=serving.core.session_cache_tokens_left if serving else 0,
        open_sessions=len(serving.core.sessions) if serving else 0,
        max_length=c.limits.max_length,
        dtype=DTYPE_NAMES.get(c.dtype, str(c.dtype)),
        device=",".join(str(d) for d in c.devices),
        version=swarm.__version__,
        addrs=source.reach.addrs,
        reachability=source.reach.mode,
        relays=source.reach.relays,
        observed_group=source.reach.observed_group,
        tp=tp,
        devices=source.device_info[:tp],
        tp_choices=c.tp_choices,
        tp_speeds=tuple((degree, *speed) for degree, speed in serving.speeds) if serving else (),
        quant=c.quant,
        weight_bytes_per_block=serving.weight_bytes if serving else 0,
        role=source.role,
        **_partition_fields(source.group, c.spec.config),
        region=c.region,
        links=source.links,
        auto=c.auto,
        max_blocks=c.max_blocks,
        plan_version=source.plan_version,
        next_start=next_range[0] if next_range else 0,
        next_end=next_range[1] if next_range else 0,
        relay_slots_free=source.relay_slots_free,
    )


def _partition_fields(group: TPGroup | None, model_config) -> dict:
    """The record's tp_* fields of an uneven split (nothing for an even one)."""
    if group is None or group.partition is None or group.repartitioner is None:
        return {}
    partition = group.partition
    return {
        "tp_partition": group.split.mode,
        "tp_shares": tuple(zip(partition.heads(model_config), partition.mlp_columns, strict=True)),
        "tp_predicted_step_ms": group.predicted_step_s() * 1000,
        "tp_observed_step_ms": group.observed_step_s * 1000,
        "tp_repartitions": group.repartitions,
    }
