"""Peer records -> the scheduler's cluster (HexGen §4.1: devices D with M_d, m_d, c_d; links A, B).

Each planned peer becomes one scheduler device, id and machine = its peer id: a swarm peer is
one process, one tensor-parallel group, so the scheduler must never split it into several stages
or put two peers in one stage (`planner.py` repairs plans that do). Its figures:

- memory M_d: `max_blocks` layers' worth (with their KV cache, Eq. 7) when the peer states it,
  else its devices' memory (GPU) or half its RAM (CPU);
- memory bandwidth m_d: one block's weights over the measured decode time of one block;
- compute c_d: the FLOPs of one token through one block times the measured prefill tokens/s.

So the cost model sees what the peer measured, not a catalog row. Links start from the cluster
file's defaults (`routing/scheduler/cluster.py`); a measured round trip replaces the latency of
its pair (half the round trip, one way). Regions: the operator's `--region`, else peers whose
measured round trips are below REGION_RTT_MS form one region (connected components).
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from routing.scheduler.cluster import Cluster, Device, Network, build_cluster
from routing.scheduler.cost_model import stage_memory
from routing.scheduler.model_spec import ModelSpec, Workload
from swarm.records import PeerRecord

REGION_RTT_MS = 20.0  # peers closer than this are in one region (same city / cloud zone)
DEFAULT_REGION = "default"


def device_of(record: PeerRecord, model: ModelSpec, workload: Workload, region: str) -> Device:
    """The scheduler device standing for one peer (its whole TP group)."""
    tokens = workload.s_in_max + workload.s_out
    if record.max_blocks > 0:
        # Exactly max_blocks layers fit (Eq. 7 with the layers' KV cache), plus a byte of slack.
        memory = stage_memory(model, 1, record.max_blocks, tokens) + 1.0
    else:
        on_gpu = [d.memory_bytes for d in record.devices if d.type != "cpu"]
        ram = record.devices[0].memory_bytes / 2 if record.devices else 16 * 2**30
        memory = 0.9 * sum(on_gpu) if on_gpu else ram
    decode_s = max(record.decode_ms_per_block, 1e-3) / 1000.0
    bandwidth = model.layer_bytes / decode_s
    flops = 2.0 * model.params_per_layer * max(record.throughput, 1e-3)
    name = record.devices[0].name if record.devices else record.device
    return Device(record.peer_id, name, record.peer_id, region, float(memory), bandwidth, flops)


def regions_of(records: Sequence[PeerRecord]) -> dict[str, str]:
    """peer id -> region: the operator's label, else inferred by clustering measured round trips."""
    labelled = {r.peer_id: r.region for r in records if r.region}
    graph = nx.Graph()
    graph.add_nodes_from(r.peer_id for r in records)
    for r in records:
        for other, ms in r.rtt_ms:
            if other in graph and other != r.peer_id and ms < REGION_RTT_MS:
                graph.add_edge(r.peer_id, other)
    regions = dict(labelled)
    for i, component in enumerate(sorted(nx.connected_components(graph), key=min)):
        labels = sorted({labelled[p] for p in component if p in labelled})
        # An unlabelled peer near labelled ones joins their region; a group of only unlabelled peers
        # gets its own (a lone peer without measurements falls into the default region).
        name = labels[0] if labels else (DEFAULT_REGION if len(component) == 1 else f"rtt-{i}")
        for p in component:
            regions.setdefault(p, name)
    return regions


def measured_rtts(records: Sequence[PeerRecord]) -> dict[tuple[str, str], float]:
    """(a, b) with a < b -> round trip in ms, averaged over both ends' measurements."""
    sums: dict[tuple[str, str], list[float]] = {}
    for r in records:
        for other, ms in r.rtt_ms:
            if other != r.peer_id:
                sums.setdefault(tuple(sorted((r.peer_id, other))), []).append(ms)
    return {pair: sum(v) / len(v) for pair, v in sums.items()}


def build_view(
    records: Sequence[PeerRecord], model: ModelSpec, workload: Workload, network: Network | None = None
) -> Cluster:
    """The cluster of `records` (one device per peer), links from defaults and measurements."""
    regions = regions_of(records)
    devices = [device_of(r, model, workload, regions[r.peer_id]) for r in records]
    cluster = build_cluster(devices, network or Network())
    for (a, b), ms in measured_rtts(records).items():
        if a in cluster._positions and b in cluster._positions:
            i, j = cluster.index(a), cluster.index(b)
            cluster.latency[i, j] = cluster.latency[j, i] = ms / 2000.0  # one way, seconds
    return cluster
