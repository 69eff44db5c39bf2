"""What `hexswarm monitor` shows, as plain JSON: every model, its peers and its block coverage.

Everything comes from the peers' signed DHT records and the coordinator's lease and plan
records (what `hexswarm status` reads) plus the monitor's own round trip to each peer (a PING,
as clients measure it).

Tokens/s: peers announce their measured speeds and open sessions, but no count of tokens
served, so the swarm's tokens/s cannot be measured from outside. The monitor shows an
estimate from the announced speeds instead, and says so: the decode rate of one sequence
along the fastest chain (per block, the fastest online peer's decode ms; network excluded).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from hexswarm.swarm.coordinator.records import Coordination, Trust, read_coordination_sync
from hexswarm.swarm.trust import speed_reports
from hexswarm.swarm.trust.records import (
    PeerRecord,
    PeerState,
    online_peers_per_block,
    read_models,
    read_peer_records,
)

TOKENS_PER_S_NOTE = (
    "estimate, not a measurement: one sequence's decode rate along the fastest chain, from the "
    "peers' announced decode ms per block (network round trips excluded); peers do not announce "
    "how many tokens they serve"
)


def peer_entry(record: PeerRecord, rtt_ms: float | None, ping_error: str | None = None) -> dict[str, Any]:
    """A record as JSON, with every field it has (so fields added to PeerRecord later show up too),
    with one label per TP rank's device and the monitor's round trip (or why it got none)."""
    entry = dataclasses.asdict(record)
    entry["state"] = record.state.value
    entry["addrs"] = list(record.addrs)
    entry["layers"] = f"{record.start}:{record.end}"
    entry["device_info"] = entry.pop("devices")  # one map per TP rank (type, name, memory, cores)
    entry["devices"] = device_labels(record)
    entry["rtt_ms"] = rtt_ms
    entry["ping_error"] = ping_error
    return entry


def observed_entry(entry: dict, record: PeerRecord, observed: dict[str, speed_reports.Observed]) -> dict:
    """`entry` with what clients observed of the peer's decode speed, and whether it announces
    itself over TRUST_FACTOR times faster (then planners use the observed figure)."""
    figure = observed.get(record.peer_id)
    entry["observed_ms_per_block"] = figure.ms_per_block if figure else None
    entry["observed_reporters"] = figure.reporters if figure else 0
    entry["over_announced"] = speed_reports.over_announced(record, observed) is not None
    return entry


def device_labels(record: PeerRecord) -> list[str]:
    """One short label per TP rank ("cuda NVIDIA H100 80GB, 79 GiB", "cpu, 4 cores"); records
    from peers that predate per-rank devices show their one device string."""
    if not record.devices:
        return [record.device]
    labels = []
    for d in record.devices:
        detail = f"{d.cores} cores" if d.type == "cpu" else f"{d.name}, {d.memory_bytes / 2**30:.0f} GiB"
        labels.append(f"{d.type}, {detail}")
    return labels


def estimated_decode_tokens_per_s(records: list[PeerRecord], num_blocks: int) -> float | None:
    """1000 / sum over blocks of the fastest online peer's decode ms for that block; None if a
    block has no online peer."""
    best = [float("inf")] * num_blocks
    for r in records:
        if r.state == PeerState.ONLINE and r.decode_ms_per_block > 0:
            for block in range(r.start, min(r.end, num_blocks)):
                best[block] = min(best[block], r.decode_ms_per_block)
    total_ms = sum(best)
    if not num_blocks or total_ms == float("inf"):
        return None
    return 1000.0 / total_ms


def model_entry(
    model_id: str,
    num_blocks: int,
    records: list[PeerRecord],
    rtts: dict[str, float],
    coordination: Coordination | None = None,
    observed: dict[str, speed_reports.Observed] | None = None,
    silent: dict[str, str] | None = None,
) -> dict:
    """One model's JSON; `observed`: what clients observed of its peers (swarm/trust/speed_reports.py);
    `silent`: peers announced online that did not answer a ping, and why (left out of coverage)."""
    silent = silent or {}
    coverage = online_peers_per_block([r for r in records if r.peer_id not in silent], num_blocks)
    peers = sorted(records, key=lambda r: (r.start, r.end, r.name))
    return {
        "model_id": model_id,
        "num_blocks": num_blocks,
        "coverage": coverage,
        "missing": [b for b, n in enumerate(coverage) if n == 0],
        "single_peer": [b for b, n in enumerate(coverage) if n == 1],
        "peers": [
            observed_entry(peer_entry(r, rtts.get(r.peer_id), silent.get(r.peer_id)), r, observed or {})
            for r in peers
        ],
        "open_sessions": sum(r.open_sessions for r in records),  # a leaving peer still serves its own
        "estimated_tokens_per_s": estimated_decode_tokens_per_s(records, num_blocks),
        **plan_data(coordination or Coordination(None, None, 0), records),
    }


def collect(swarm, only: dict[str, int] | None = None, trust: Trust = None) -> dict[str, Any]:
    """A snapshot of the swarm seen through `swarm` (a client.SwarmClient): of the models in
    `only` (model id -> blocks), or of every model some peer announced; the lease and plans
    as peers that trust `trust` see them (swarm/coordinator/records.py)."""
    models = []
    for model_id, num_blocks in sorted((only if only is not None else read_models(swarm.dht)).items()):
        records = [r for r in read_peer_records(swarm.dht, model_id) if r.end <= num_blocks]
        pinged = [r for r in records if r.state != PeerState.JOINING]
        rtts = swarm.round_trips(pinged)
        silent = {
            r.peer_id: swarm.ping_errors.get(r.peer_id, "no answer") for r in pinged if r.peer_id not in rtts
        }
        coordination = read_coordination_sync(swarm.dht, model_id, trust=trust)
        observed = speed_reports.combine(speed_reports.read(swarm.dht, model_id))
        models.append(model_entry(model_id, num_blocks, records, rtts, coordination, observed, silent))
    rates = [m["estimated_tokens_per_s"] for m in models if m["estimated_tokens_per_s"] is not None]
    return {
        "time": time.time(),
        "models": models,
        "peers_online": len(
            {p["peer_id"] for m in models for p in m["peers"] if p["state"] == PeerState.ONLINE.value}
        ),
        "open_sessions": sum(m["open_sessions"] for m in models),
        "estimated_tokens_per_s": sum(rates) if rates else None,
        "tokens_per_s_note": TOKENS_PER_S_NOTE,
    }


def followers(coordination: Coordination, records: list[PeerRecord]) -> list[PeerRecord]:
    """Auto peers that follow the current plan (their record names its version)."""
    plan = coordination.plan
    return [r for r in records if plan is not None and r.auto and r.plan_version == plan.version]


def plan_data(coordination: Coordination, records: list[PeerRecord]) -> dict:
    """The coordinator and its plan as JSON-ready data (`status --json` and the monitor)."""
    plan = coordination.plan
    return {
        "coordinator": coordination.holder.holder if coordination.holder else None,
        "plan": None
        if plan is None
        else {**plan.to_dict(), "followers": sorted(r.peer_id for r in followers(coordination, records))},
    }
