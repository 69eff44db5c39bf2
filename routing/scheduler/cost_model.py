"""HexGen's cost model: Table 1 and Appendix B, with prefill and decode terms kept apart.

For stage j of pipeline i, served by the TP group d (|d| devices) with l layers, and a task of
batch b, prompt s_in and s_out generated tokens (HexGen Appendix B; HexGen-2 Table 1 splits the
same terms by phase):

    comp    (Eq. 4)  prefill: max_d 24 b s_in H^2 / (|d| c_d) * l
                     decode:  max_d 12 H^2 B s_out / (|d| m_d) * l + max_d 24 b s_out H^2 / (|d| c_d) * l
    comm-tp (Eq. 5)  prefill: max_d sum_{d' != d} (a_dd' + b s_in H B / (|d| b_dd')) * 4 l
                     decode:  max_d sum_{d' != d} (a_dd' + b H B / (|d| b_dd')) * 4 s_out l
    comm-pp (Eq. 6)  prefill: min_{d in stage j, d' in stage j+1} (a_dd' + b s_in H B / b_dd')
                     decode:  min_{d, d'} (a_dd' + b H B / b_dd') * s_out
    mem     (Eq. 7)  (12 H^2 B / |d| + 2 b (s_in + s_out) H B / |d|) * l + 4 b (s_in + s_out) H B

12H^2 is the parameter count of one layer and the "2 ... H" of Eq. 7 is its key and value per
token; both come from `ModelSpec` (exact for grouped-query attention and gated MLPs, equal to
the paper's terms for a standard layer). Times are seconds, sizes bytes. `s_in` may be a numpy
array of prompt lengths: every term is evaluated elementwise. The decode terms also take an
array `batch` (one decode cost per batch size, as the serving simulator tabulates them).

Weight formats: a device may store its layers' weights quantized (`Device.quant`, one of
`weight_formats.QUANT_FORMATS`). The 12 H^2 B of Eq. 7 (the weights a stage holds) and of Eq. 4's
decode term (the weights each token's step reads from memory) are then 12 H^2 times the format's
bytes per weight (`stage_layer_bytes`), so a quantized stage holds more layers and scans them
faster; the KV cache, the activations and the messages of Eq. 5 and 6 stay in the compute dtype B.
A stage is one peer (one TP group), so its devices share one format; where they differ the
stage is counted at the largest bytes per weight among them (conservative).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hexswarm.routing.scheduler.cluster import Cluster, Device
from hexswarm.routing.scheduler.model_spec import ModelSpec
from hexswarm.routing.scheduler.weight_formats import bytes_per_weight

ArrayLike = float | np.ndarray


@dataclass(frozen=True)
class PhaseCost:
    """Seconds spent in the prefill phase and in the decode phase (all s_out tokens)."""

    prefill: ArrayLike
    decode: ArrayLike

    @property
    def total(self) -> ArrayLike:
        return self.prefill + self.decode

    def __add__(self, other: PhaseCost) -> PhaseCost:
        return PhaseCost(self.prefill + other.prefill, self.decode + other.decode)

    def scaled(self, factor: float) -> PhaseCost:
        return PhaseCost(self.prefill * factor, self.decode * factor)


ZERO = PhaseCost(0.0, 0.0)


def device_layer_bytes(device: Device, model: ModelSpec) -> float:
    """Bytes one layer's weights take on `device`: as a peer measured them, else the model's layer
    at the device's format (`ModelSpec.layer_weight_bytes`)."""
    return device.weight_bytes_per_layer or model.layer_weight_bytes(device.quant)


def stage_layer_bytes(cluster: Cluster, devs: Sequence[int], model: ModelSpec) -> float:
    """The 12 H^2 B of Eq. 4 and Eq. 7 for a stage: the largest of its devices' (module docstring)."""
    return max(device_layer_bytes(cluster.devices[d], model) for d in devs)


def stage_quant(cluster: Cluster, devs: Sequence[int], model: ModelSpec) -> str:
    """The weight format a stage is counted at: its devices' one, else the one of the most bytes
    per weight among them (module docstring)."""
    formats = sorted({cluster.devices[d].quant for d in devs})
    return max(formats, key=lambda quant: bytes_per_weight(quant, model.dtype_bytes))


def weight_memory(device: Device, model: ModelSpec) -> float:
    """M_d counted in layers of the compute dtype: memory times how many more weights the device's
    format fits in a byte (M_d itself for "none"). What memory-proportional heuristics compare
    (§4.3's layer split, whether devices together hold a replica) across formats."""
    layer = device_layer_bytes(device, model)
    if layer == model.layer_bytes:
        return device.memory_bytes
    return device.memory_bytes * model.layer_bytes / layer


def comp_cost(
    cluster: Cluster,
    devs: Sequence[int],
    model: ModelSpec,
    layers: int,
    s_in: ArrayLike,
    s_out: int,
    batch: int = 1,
) -> PhaseCost:
    """Computation time of a stage, HexGen Eq. 4 (memory scan + matmul FLOPs)."""
    n = len(devs)
    min_bw = min(cluster.devices[d].bandwidth for d in devs)
    min_flops = min(cluster.devices[d].flops for d in devs)
    flops_per_token = 2.0 * model.params_per_layer * batch  # the 24 b H^2 of Table 1
    scan = stage_layer_bytes(cluster, devs, model) * s_out / (n * min_bw) * layers
    prefill = flops_per_token * s_in / (n * min_flops) * layers
    decode = scan + flops_per_token * s_out / (n * min_flops) * layers
    return PhaseCost(prefill, decode)


def tp_comm_cost(
    cluster: Cluster,
    devs: Sequence[int],
    model: ModelSpec,
    layers: int,
    s_in: ArrayLike,
    s_out: int,
    batch: int = 1,
) -> PhaseCost:
    """All-reduce time of a TP group under the BSP model, HexGen Eq. 5 (0 for one device)."""
    n = len(devs)
    if n == 1:
        return ZERO
    idx = np.asarray(devs)
    alpha = cluster.latency[np.ix_(idx, idx)]
    inv_beta = 1.0 / cluster.bandwidth[np.ix_(idx, idx)]  # 0 on the diagonal
    np.fill_diagonal(alpha, 0.0)
    msg = batch * model.hidden_size * model.dtype_bytes / n  # bytes of one token's chunk
    alpha_sum = alpha.sum(axis=1)  # (n,) sum over d' != d
    inv_sum = inv_beta.sum(axis=1)
    s = np.asarray(s_in, dtype=float)
    prefill = np.max(alpha_sum[:, None] + np.outer(inv_sum, np.atleast_1d(s)) * msg, axis=0) * 4 * layers
    decode = _max_over_rows(alpha_sum, inv_sum, msg) * 4 * s_out * layers
    return PhaseCost(prefill if s.ndim else float(prefill[0]), decode)


def pp_comm_cost(
    cluster: Cluster,
    devs_a: Sequence[int],
    devs_b: Sequence[int],
    model: ModelSpec,
    s_in: ArrayLike,
    s_out: int,
    batch: int = 1,
) -> PhaseCost:
    """Activation hop from one stage to the next over the fastest link, HexGen Eq. 6."""
    idx = np.ix_(np.asarray(devs_a), np.asarray(devs_b))
    alpha = cluster.latency[idx].ravel()
    inv_beta = 1.0 / cluster.bandwidth[idx].ravel()
    token_bytes = batch * model.hidden_size * model.dtype_bytes
    s = np.asarray(s_in, dtype=float)
    prefill = np.min(alpha[:, None] + np.outer(inv_beta, np.atleast_1d(s)) * token_bytes, axis=0)
    decode = -_max_over_rows(-alpha, -inv_beta, token_bytes) * s_out
    return PhaseCost(prefill if s.ndim else float(prefill[0]), decode)


def _max_over_rows(alpha: np.ndarray, inv_beta: np.ndarray, size: ArrayLike) -> ArrayLike:
    """max_d (alpha_d + inv_beta_d * size); `size` may be an array (one value per batch size)."""
    if np.ndim(size) == 0:
        return float(np.max(alpha + inv_beta * size))
    return np.max(alpha[:, None] + np.outer(inv_beta, size), axis=0)


def stage_memory(
    model: ModelSpec, tp: int, layers: int, tokens: int, batch: int = 1, layer_bytes: float | None = None
) -> float:
    """Bytes each device of a TP group of `tp` needs, HexGen Eq. 7; tokens = s_in + s_out.
    `layer_bytes`: one layer's weights in the stage's format (`stage_layer_bytes`); None: the
    compute dtype's (`model.layer_bytes`)."""
    weights = model.layer_bytes if layer_bytes is None else layer_bytes
    per_layer = (weights + 2.0 * batch * tokens * model.kv_width * model.dtype_bytes) / tp
    activations = 4.0 * batch * tokens * model.hidden_size * model.dtype_bytes
    return per_layer * layers + activations


def max_layers(
    model: ModelSpec,
    tp: int,
    memory_bytes: float,
    tokens: int,
    batch: int = 1,
    layer_bytes: float | None = None,
) -> int:
    """Most layers a TP group of `tp` devices with `memory_bytes` each can hold (Eq. 7 <= M_d),
    with weights of `layer_bytes` a layer (`stage_memory`)."""
    fixed = stage_memory(model, tp, 0, tokens, batch, layer_bytes)
    per_layer = stage_memory(model, tp, 1, tokens, batch, layer_bytes) - fixed
    if memory_bytes <= fixed:
        return 0
    return int((memory_bytes - fixed) // per_layer)


def group_max_layers(
    cluster: Cluster, devs: Sequence[int], model: ModelSpec, tokens: int, batch: int = 1
) -> int:
    """Most layers the TP group `devs` can hold: Eq. 7 at its format <= its smallest M_d."""
    memory = min(cluster.devices[d].memory_bytes for d in devs)
    return max_layers(model, len(devs), memory, tokens, batch, stage_layer_bytes(cluster, devs, model))


@dataclass(frozen=True)
class StageSpec:
    """A stage as the cost model sees it: device indices into a Cluster and a layer count."""

    devices: tuple[int, ...]
    layers: int


def pipeline_cost(
    cluster: Cluster,
    stages: Sequence[StageSpec],
    model: ModelSpec,
    s_in: ArrayLike,
    s_out: int,
    batch: int = 1,
) -> PhaseCost:
    """End-to-end cost of one request through a pipeline, HexGen Eq. 2."""
    total = ZERO
    for j, stage in enumerate(stages):
        total = total + comp_cost(cluster, stage.devices, model, stage.layers, s_in, s_out, batch)
        total = total + tp_comm_cost(cluster, stage.devices, model, stage.layers, s_in, s_out, batch)
        if j + 1 < len(stages):
            total = total + pp_comm_cost(
                cluster, stage.devices, stages[j + 1].devices, model, s_in, s_out, batch
            )
    return total


def pipeline_fits(
    cluster: Cluster, stages: Sequence[StageSpec], model: ModelSpec, tokens: int, batch: int = 1
) -> bool:
    """Whether every device of every stage holds its share (Eq. 7 <= M_d for all d)."""
    for stage in stages:
        weights = stage_layer_bytes(cluster, stage.devices, model)
        need = stage_memory(model, len(stage.devices), stage.layers, tokens, batch, weights)
        if any(cluster.devices[d].memory_bytes < need for d in stage.devices):
            return False
    return sum(s.layers for s in stages) == model.num_layers


def swarm_reference_latency(
    cluster: Cluster, model: ModelSpec, s_in: float, s_out: int, batch: int = 1
) -> float:
    """A live swarm's SLO unit: one request through the whole model on the swarm's fastest device
    alone (TP 1, memory not checked, no network), from this cost model with the devices' measured
    figures. HexGen's unit (`reference_latency`) is an A100 machine's, which a CPU or consumer-GPU
    swarm never comes near: every plan would then miss every deadline and score 0."""
    return min(
        float(pipeline_cost(cluster, [StageSpec((i,), model.num_layers)], model, s_in, s_out, batch).total)
        for i in range(len(cluster.devices))
    )


def reference_latency(model: ModelSpec, s_in: float, s_out: int, batch: int = 1) -> float:
    """The SLO's unit (HexGen §5.1: "multiples of the execution latency of A100 GPUs").

    Latency of the whole model on one 8 x A100-40G machine with TP=8 over NVLink (AWS
    p4d.24xlarge, the paper's homogeneous baseline), from this same cost model; memory is not
    checked, so the unit exists for any model.
    """
    from hexswarm.routing.scheduler.cluster import Device, Link, Network, build_cluster
    from hexswarm.routing.scheduler.gpu_catalog import lookup

    a100 = lookup("A100-40G")
    devices = [Device.from_spec(f"ref{i}", a100, "ref", "ref") for i in range(8)]
    nvlink = Link(5e-6, 300e9)  # NVLink 3 through NVSwitch: 300 GB/s each way per GPU
    cluster = build_cluster(devices, Network(same_machine=nvlink))
    stage = StageSpec(tuple(range(8)), model.num_layers)
    return float(pipeline_cost(cluster, [stage], model, s_in, s_out, batch).total)
