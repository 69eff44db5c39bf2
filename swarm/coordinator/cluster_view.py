"""Peer records -> the scheduler's cluster (HexGen §4.1: devices D with M_d, m_d, c_d; links A, B).

A swarm peer is one process, one tensor-parallel group on one machine of one GPU type (HexGen
§4.2's rule for TP groups), so its devices form one scheduler *machine* (machine = peer id), and
the scheduler runs with `one_stage_per_machine`: a machine serves at most one stage, at a TP
degree in {1, 2, 4, 8} of its devices, the rest idle (`algorithm1.dp(whole_buckets=True)`).

- A peer whose degree is fixed (no `tp_choices`, or `--layers A:B`, or an older peer) is ONE
  scheduler device standing for its whole group (id = its peer id), so its stage has degree 1 in
  the scheduler's eyes and keeps its own `tp`.
- A `--layers auto --tp auto` peer offers degrees (`tp_choices`); it becomes K devices
  f"{peer_id}#{i}", K the largest power of two such that every power of two up to K is offered
  (at most 8, the scheduler's largest degree), so the degree of its stage is the plan's choice.

Figures, from what the peer measured at its current degree `tp` (not from a catalog row):

- memory bandwidth m_d: one block's weights over the measured decode time of one block;
- compute c_d: the FLOPs of one token through one block times the measured prefill tokens/s;
- memory M_d: `max_blocks` layers' worth (with their KV cache, Eq. 7) when the peer states it,
  else its devices' memory (GPU, 0.9x) or half its RAM (CPU).

Weight formats: a peer's devices take its `quant` and the bytes one of its blocks really takes
(`weight_bytes_per_block`, else the model's block at its format: `block_bytes`). The cost model
counts its layers at those bytes (Eq. 7, and the scan of Eq. 4), so `max_blocks` layers' worth is
counted at its format and m_d is those bytes over the measured decode time: the cost model's
weight scan of one block on the peer takes exactly the decode time it measured.

A K-device peer gets one rank's figures: m_d and c_d from what it measured at degree 1 (its
`tp_speeds`, a one-block stack on its leader at start), else the group's over `tp`; M_d its
GPU's memory (0.9x). The links between its ranks take the latency a of HexGen Eq. 5 that makes
the cost model's decode step at its widest measured degree n equal the measured one,

    t_n = t_1 / n + 1 / (n x_1) + 4 (n - 1) a    (per token and layer; t_1, x_1: decode seconds
                                                   and prefill tokens/s per block at degree 1),

so a group whose all-reduce is slow (gloo ranks sharing a CPU) is not planned as if its ranks
added up. Where the ranks do not have memories of their own (CPU ranks share the machine's RAM)
or the peer states `max_blocks` (counted at its current degree), M_d is the group's memory above
split evenly over the K devices: a simplification (activations and a degree's own overheads are
not re-measured) that keeps the total what the peer stated.

Links start from the cluster file's defaults (`routing/scheduler/cluster.py`); a measured round
trip replaces the latency of its pair of peers (half the round trip, one way). Regions: the
operator's `--region`, else peers whose measured round trips are below REGION_RTT_MS form one
region (connected components).
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import numpy as np

from hexswarm.routing.scheduler.cluster import Cluster, Device, Network, build_cluster
from hexswarm.routing.scheduler.cost_model import max_layers, stage_memory
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.algorithm1 import TP_DEGREES
from hexswarm.swarm.trust.records import PeerRecord, links_by_peer

REGION_RTT_MS = 20.0  # peers closer than this are in one region (same city / cloud zone)
DEFAULT_REGION = "default"
RANK_SEPARATOR = "#"  # in f"{peer_id}#{rank}"; base58 peer ids never contain it


def degree_choices(record: PeerRecord) -> tuple[int, ...]:
    """The TP degrees the plan may give `record`: (1, 2, .., K) (module docstring), or () when
    its degree is fixed at `tp`. Records are remote input: a list that is not downward closed
    is read up to its first gap."""
    if not record.auto:
        return ()
    degrees = []
    for t in TP_DEGREES:
        if t not in record.tp_choices:
            break
        degrees.append(t)
    return tuple(degrees) if len(degrees) > 1 else ()


def device_ids(record: PeerRecord) -> tuple[str, ...]:
    """The scheduler device ids standing for a peer: its K ranks, or its peer id alone."""
    choices = degree_choices(record)
    return _rank_ids(record.peer_id, choices[-1]) if choices else (record.peer_id,)


def serving_ids(record: PeerRecord) -> tuple[str, ...]:
    """The device ids of the group a peer serves with now (its first `tp` ranks). A current
    degree the scheduler cannot plan (not a power of two, or above K) names ranks the cluster
    lacks: every plan then differs from it, a full reload, as it is for the peer."""
    return _rank_ids(record.peer_id, record.tp) if degree_choices(record) else (record.peer_id,)


def _rank_ids(peer_id: str, ranks: int) -> tuple[str, ...]:
    return tuple(f"{peer_id}{RANK_SEPARATOR}{i}" for i in range(ranks))


def peer_of(device_id: str) -> str:
    """The peer id of a scheduler device id (the inverse of `device_ids`)."""
    return device_id.split(RANK_SEPARATOR, 1)[0]


def stage_degree(record: PeerRecord, stage_devices: int) -> int:
    """The TP degree a peer serves a stage of `stage_devices` scheduler devices at."""
    return stage_devices if degree_choices(record) else record.tp


def group_memory(record: PeerRecord, model: ModelSpec, workload: Workload) -> float:
    """M_d of the peer's whole group at its current degree (module docstring)."""
    if record.max_blocks > 0:
        # Exactly max_blocks layers fit (Eq. 7 with the layers' KV cache), plus a byte of slack.
        tokens = workload.s_in_max + workload.s_out
        return stage_memory(model, 1, record.max_blocks, tokens, 1, block_bytes(record, model)) + 1.0
    on_gpu = _gpu_memories(record)
    ram = record.devices[0].memory_bytes / 2 if record.devices else 16 * 2**30
    return 0.9 * sum(on_gpu) if on_gpu else ram


def capacity_blocks(record: PeerRecord, model: ModelSpec, workload: Workload, tp: int) -> int:
    """How many blocks the peer can hold at degree `tp`: its `max_blocks`, else what its memory
    holds with one request's KV cache (HexGen Eq. 7), at most the whole model."""
    if record.max_blocks > 0:
        return min(record.max_blocks, model.num_layers)
    tokens = workload.s_in_max + workload.s_out
    memory = rank_memory(record, model, workload, tp)
    return min(model.num_layers, max_layers(model, tp, memory, tokens, 1, block_bytes(record, model)))


def rank_memory(record: PeerRecord, model: ModelSpec, workload: Workload, k: int) -> float:
    """M_d of one of a K-device peer's ranks: its GPU's memory, else a K-th of the group's."""
    on_gpu = _gpu_memories(record)
    if on_gpu and record.max_blocks <= 0:
        return 0.9 * min(on_gpu)
    return group_memory(record, model, workload) / k


def _gpu_memories(record: PeerRecord) -> list[int]:
    return [d.memory_bytes for d in record.devices if d.type != "cpu"]


def block_bytes(record: PeerRecord, model: ModelSpec) -> float:
    """Bytes one block's weights take on the peer: as it states them, else the model's block at
    its format (what `cost_model.device_layer_bytes` reads back from its devices)."""
    return float(record.weight_bytes_per_block) or model.layer_weight_bytes(record.quant)


def speed_figures(
    model: ModelSpec, tokens_per_s: float, decode_ms: float, layer_bytes: float
) -> tuple[float, float]:
    """(m_d, c_d) of a measured (prefill tokens/s, decode ms) per block whose weights take
    `layer_bytes` (module docstring)."""
    bandwidth = layer_bytes / (max(decode_ms, 1e-3) / 1000.0)
    return bandwidth, 2.0 * model.params_per_layer * max(tokens_per_s, 1e-3)


def measured_speeds(record: PeerRecord) -> dict[int, tuple[float, float]]:
    """Degree -> (prefill tokens/s, decode ms) per block, as the peer measured them (`tp_speeds`)."""
    return {tp: (tokens_per_s, ms) for tp, tokens_per_s, ms in record.tp_speeds}


def rank_speed(record: PeerRecord) -> tuple[float, float, int]:
    """(prefill tokens/s, decode ms) per block to divide into one rank's figures, and by how much:
    its degree-1 measurement, else the group's figures at its current degree."""
    measured = measured_speeds(record)
    if 1 in measured:
        return (*measured[1], 1)
    return record.throughput, record.decode_ms_per_block, max(record.tp, 1)


def rank_link_latency(record: PeerRecord) -> float | None:
    """One-way seconds `a` between two ranks of a peer, fitted to its measured degrees (module
    docstring); None without a degree-1 and a wider measurement."""
    measured = measured_speeds(record)
    wider = [tp for tp in measured if tp > 1]
    if 1 not in measured or not wider:
        return None
    n = max(wider)
    (x_1, ms_1), (_, ms_n) = measured[1], measured[n]
    t_1, t_n = ms_1 / 1000.0, ms_n / 1000.0
    return max(t_n - t_1 / n - 1.0 / (n * x_1), 0.0) / (4 * (n - 1))


def devices_of(record: PeerRecord, model: ModelSpec, workload: Workload, region: str) -> list[Device]:
    """The scheduler devices standing for one peer: one for its whole group, or its K ranks."""
    name = record.devices[0].name if record.devices else record.device
    ids = device_ids(record)
    formats = {"quant": record.quant, "weight_bytes_per_layer": float(record.weight_bytes_per_block)}
    layer_bytes = block_bytes(record, model)
    if len(ids) == 1:
        bandwidth, flops = speed_figures(model, record.throughput, record.decode_ms_per_block, layer_bytes)
        memory = group_memory(record, model, workload)
        return [Device(ids[0], name, record.peer_id, region, float(memory), bandwidth, flops, **formats)]
    memory = rank_memory(record, model, workload, len(ids))
    tokens_per_s, decode_ms, share = rank_speed(record)
    bandwidth, flops = speed_figures(model, tokens_per_s, decode_ms, layer_bytes)
    return [
        Device(i, name, record.peer_id, region, float(memory), bandwidth / share, flops / share, **formats)
        for i in ids
    ]


def regions_of(records: Sequence[PeerRecord]) -> dict[str, str]:
    """peer id -> region: the operator's label, else inferred by clustering measured round trips."""
    labelled = {r.peer_id: r.region for r in records if r.region}
    graph = nx.Graph()
    graph.add_nodes_from(r.peer_id for r in records)
    for peer_id, links in links_by_peer(records):
        for other, ms in links:
            if other != peer_id and ms < REGION_RTT_MS:
                graph.add_edge(peer_id, other)
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
    for peer_id, links in links_by_peer(records):
        for other, ms in links:
            if other != peer_id:
                sums.setdefault(tuple(sorted((peer_id, other))), []).append(ms)
    return {pair: sum(v) / len(v) for pair, v in sums.items()}


def build_view(
    records: Sequence[PeerRecord], model: ModelSpec, workload: Workload, network: Network | None = None
) -> Cluster:
    """The cluster of `records` (one device per peer, or K per peer that offers degrees), links
    from defaults and measurements (a measured round trip applies to every pair of their devices)."""
    regions = regions_of(records)
    devices = [d for r in records for d in devices_of(r, model, workload, regions[r.peer_id])]
    cluster = build_cluster(devices, network or Network())
    positions: dict[str, list[int]] = {}
    for i, d in enumerate(cluster.devices):
        positions.setdefault(d.machine, []).append(i)
    for (a, b), ms in measured_rtts(records).items():
        for i in positions.get(a, ()):
            for j in positions.get(b, ()):
                cluster.latency[i, j] = cluster.latency[j, i] = ms / 2000.0  # one way, seconds
    for r in records:
        latency = rank_link_latency(r) if len(positions.get(r.peer_id, ())) > 1 else None
        if latency is not None:
            ranks = positions[r.peer_id]
            cluster.latency[np.ix_(ranks, ranks)] = latency
            cluster.latency[ranks, ranks] = 0.0
    return cluster
