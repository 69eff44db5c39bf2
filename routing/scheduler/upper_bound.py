"""The most tokens/s any placement of a cluster could serve: a linear program (Helix-style).

Helix (Mei et al., ASPLOS 2025) bounds a heterogeneous cluster's serving rate by a flow over
GPUs whose capacities come from compute, memory bandwidth, memory and links. This module does
the same under HexGen's cost model (`cost_model.py`, Eq. 4 and Eq. 7), for a serving model
that pipelines requests and batches up to `max_batch` decode steps into one step, so that
`plan throughput / bound` says how good a plan is without a baseline.

Units. A device holding x = l / |d| "layer-equivalents" (l layers split over a TP group of
|d| devices) spends, per the cost model, at least
    prefill, per prompt token:      x * 2P / c_d                    (no weight scan, Eq. 4)
    decode step of b sequences:     x * B_l / m_d + b * x * 2P / c_d
where P = parameters of a layer, B_l its bytes, c_d its FLOP/s and m_d its memory bandwidth.
Its memory holds x * (B_l + b * kv * t) bytes for b admitted sequences of t = s_in + s_out
tokens each (Eq. 7; kv = bytes of one token's K and V in one layer).

The LP. Identical devices are aggregated into classes g (n_g devices with the same M, m, c);
each class is split over batch levels k (b_k in 1..max_batch). Variables, per (g, k):
    N  devices of the class whose decode batches never exceed b_k
    Y  decode layer-tokens/s they process     Z  prefill layer-tokens/s
    W  weight scans/s, in layers (one decode step on x layer-equivalents is x scans)
    H  layer-equivalents of weights they hold
and T, the generated tokens/s (T / s_out completed requests per second). Maximise T s.t.
    sum_k N_gk <= n_g                                    devices of each class
    (Y + Z) * 2P / c_g + W * B_l / m_g <= N_gk           each device busy <= 1 s per second
    Y <= b_k * W                                         a scan serves at most b_k tokens
    H <= N_gk * M_g / (B_l + (b_{k-1} + 1) * kv * t)     weights + KV of the batch fit (Eq. 7)
    sum H >= L                                           at least one replica is stored
    sum Y >= L * T,  sum Z >= L * T * s_in / s_out       every layer of every token processed
    Z >= rho * Y                                         prefill and decode on the same devices
The last row: a device serves one stage of one pipeline, so it runs the prefill and the decode
of exactly the requests its pipeline serves; its prefill layer-tokens are (their mean prompt /
s_out) x its decode layer-tokens. rho is a lower bound on that ratio over all pipelines: by
default s_in_min / s_out (every prompt is at least s_in_min tokens); a caller who knows the
shortest mean prompt any one pipeline served may pass it (`coupled_prompt_tokens`). Without
the row the LP would give prefill to compute-rich devices and decode to bandwidth-rich ones,
which no pipeline can do (10-12% higher on HexGen's heterogeneous clusters).
A device whose memory admits at most b sequences alongside its x layers sits at the level with
b_{k-1} < min(b, max_batch) <= b_k: its batches are <= b_k and its x fits the level's memory
cap, so every real plan is a feasible point and the optimum is an upper bound.

Relaxations (each can only raise the bound):
1. Layers are fluid: x may be any fraction and layers need not form pipelines (only their totals are covered), so stages balance perfectly.
2. A TP group runs at its own devices' speed, not at its slowest member's (Eq. 4 takes the min).
3. Communication is free: TP all-reduce (Eq. 5) and pipeline hops (Eq. 6) cost nothing, and
   links have no capacity limit. The cost model has no link contention, so a link-capacity
   constraint would not be valid for a simulator that charges hops as delays.
4. KV memory: the activation term of Eq. 7 is dropped, and a sequence needs KV only where it
   is batched (not on every stage it has passed), with t = s_in_min + s_out (shortest prompt).
5. Batches are always full at b_k: no sequence waits on another stage, no idle gaps.
6. Prompt lengths: every request's prefill is charged `prompt_tokens` tokens, by default the
   workload's shortest prompt (s_in_min), so the bound holds whichever requests a simulator
   serves. Passing the mean prompt of the requests a simulation completed gives the (tighter)
   bound that is valid for that simulation: prefill work is linear in the prompt length.
7. A class's devices may be split fractionally between batch levels, so when memory binds the
   LP can average memory over them (integer device counts would be tighter only there).
Assumed: a device serves at most one stage (true of every Plan). Throughput must be measured as
completed output tokens over the time the work took (up to the last completion): a backlog
drained after the last arrival, divided by the arrival span alone, can exceed any rate bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from routing.scheduler.cluster import Cluster
from routing.scheduler.model_spec import ModelSpec, Workload

DEFAULT_MAX_BATCH = 16  # the serving model's default (decode steps a stage batches)
_VARS = 5  # per (class, level): N, Y, Z, W, H


@dataclass(frozen=True)
class UpperBound:
    """The bound and where the optimum spends device time (shares of all devices' seconds)."""

    tok_s: float  # generated tokens per second
    requests_s: float  # completed requests per second (tok_s / s_out)
    prefill_share: float  # device time in prefill FLOPs / all device time
    decode_flops_share: float  # ... in decode FLOPs
    scan_share: float  # ... in decode weight scans (memory bandwidth)
    mean_batch: float  # decode tokens per weight scan at the optimum
    memory_binds: bool  # storing one replica (weights + KV of the batches) limits the bound
    solve_s: float  # wall-clock time of building and solving the LP

    @property
    def binding(self) -> str:
        """Which resource limits the bound, in words."""
        if self.tok_s == 0.0:
            return "memory: the cluster cannot hold one replica with KV for one sequence"
        compute = self.prefill_share + self.decode_flops_share
        kind = "compute (FLOPs)" if compute >= self.scan_share else "memory bandwidth (weight scans)"
        return kind + (", with memory for weights and KV" if self.memory_binds else "")


@dataclass(frozen=True)
class _Classes:
    """Identical devices grouped: counts and their (memory, bandwidth, flops)."""

    count: np.ndarray  # (G,)
    memory: np.ndarray  # (G,) bytes
    bandwidth: np.ndarray  # (G,) bytes/s
    flops: np.ndarray  # (G,) FLOP/s


def throughput_upper_bound(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    max_batch: int = DEFAULT_MAX_BATCH,
    prompt_tokens: float | None = None,
    coupled_prompt_tokens: float | None = None,
) -> UpperBound:
    """Upper bound on generated tokens/s of any placement of `cluster` (see the module docstring)."""
    if max_batch < 1:
        raise ValueError("max_batch must be at least 1")
    s_in = float(workload.s_in_min if prompt_tokens is None else prompt_tokens)
    coupled = float(workload.s_in_min if coupled_prompt_tokens is None else coupled_prompt_tokens)
    if s_in < 0 or coupled < 0:
        raise ValueError("prompt_tokens and coupled_prompt_tokens must not be negative")
    started = time.perf_counter()
    classes = _device_classes(cluster)
    levels = batch_levels(max_batch)
    kv_tokens = workload.s_in_min + workload.s_out  # Eq. 7's t for the shortest request
    problem = _build_lp(classes, levels, model, (s_in, coupled), kv_tokens, workload.s_out)
    result = linprog(**problem, method="highs")
    if result.status == 2:  # infeasible: not even one replica fits
        return UpperBound(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, True, time.perf_counter() - started)
    if result.status != 0:
        raise RuntimeError(f"upper-bound LP failed: {result.message}")
    return _summarise(result, classes, levels, model, workload.s_out, time.perf_counter() - started)


def _device_classes(cluster: Cluster) -> _Classes:
    figures = np.array([(d.memory_bytes, d.bandwidth, d.flops) for d in cluster.devices], dtype=float)
    if len(figures) == 0:
        raise ValueError("the cluster has no devices")
    unique, count = np.unique(figures, axis=0, return_counts=True)
    return _Classes(count.astype(float), unique[:, 0], unique[:, 1], unique[:, 2])


def batch_levels(max_batch: int) -> np.ndarray:
    """Every batch size up to 32, then powers of two, and max_batch itself (few LP columns)."""
    powers = [2**i for i in range(int(np.log2(max_batch)) + 1)]
    return np.array(sorted(set(range(1, min(max_batch, 32) + 1)) | set(powers) | {max_batch}), dtype=float)


def _build_lp(
    classes: _Classes,
    levels: np.ndarray,
    model: ModelSpec,
    prompts: tuple[float, float],
    kv_tokens: int,
    s_out: int,
) -> dict:
    """linprog arguments; columns are (g, k, v) for v in N, Y, Z, W, H, then T last.
    `prompts`: (prompt charged per request, prompt of the per-device coupling rho * s_out)."""
    s_in, coupled = prompts
    g_count, k_count = len(classes.count), len(levels)
    cells = g_count * k_count
    t_col = cells * _VARS
    flop_s = 2.0 * model.params_per_layer / classes.flops  # (G,) seconds per layer-token
    scan_s = model.layer_bytes / classes.bandwidth  # (G,) seconds per layer scan
    kv_bytes = 2.0 * model.kv_width * model.dtype_bytes * kv_tokens  # one sequence, one layer
    previous = np.concatenate(([0.0], levels[:-1]))
    # (G, K) layer-equivalents a device may hold at level k: weights + KV of b_{k-1} + 1 sequences
    cap = classes.memory[:, None] / (model.layer_bytes + (previous[None, :] + 1.0) * kv_bytes)

    def col(g: np.ndarray, k: np.ndarray, v: int) -> np.ndarray:
        return (g * k_count + k) * _VARS + v

    g_idx, k_idx = np.divmod(np.arange(cells), k_count)
    n, y, z, w, h = (col(g_idx, k_idx, v) for v in range(_VARS))
    rows, cols, vals = [], [], []

    def add(row: np.ndarray, column: np.ndarray, value: np.ndarray | float) -> None:
        rows.append(np.asarray(row))
        cols.append(np.asarray(column))
        vals.append(np.broadcast_to(np.asarray(value, dtype=float), np.shape(column)))

    r = np.arange(cells)
    for column, value in ((y, flop_s[g_idx]), (z, flop_s[g_idx]), (w, scan_s[g_idx]), (n, -1.0)):
        add(r, column, value)  # (Y + Z) 2P/c + W B_l/m - N <= 0
    add(cells + r, y, 1.0)  # Y - b_k W <= 0
    add(cells + r, w, -levels[k_idx])
    add(2 * cells + r, h, 1.0)  # H - N cap <= 0
    add(2 * cells + r, n, -cap[g_idx, k_idx])
    add(3 * cells + r, y, coupled / s_out)  # rho Y - Z <= 0
    add(3 * cells + r, z, -1.0)
    base = 4 * cells
    add(base + g_idx, n, 1.0)  # sum_k N <= n_g
    base += g_count
    replica, decode, prefill = np.full(cells, base), np.full(cells, base + 1), np.full(cells, base + 2)
    add(replica, h, -1.0)  # -sum H <= -L
    add(decode, y, -1.0)  # L T - sum Y <= 0
    add([base + 1], [t_col], float(model.num_layers))
    add(prefill, z, -1.0)  # L T s_in / s_out - sum Z <= 0
    add([base + 2], [t_col], model.num_layers * s_in / s_out)
    b_ub = np.concatenate((np.zeros(4 * cells), classes.count, [-float(model.num_layers), 0.0, 0.0]))
    a_ub = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(len(b_ub), t_col + 1),
    ).tocsr()
    objective = np.zeros(t_col + 1)
    objective[t_col] = -1.0  # maximise T
    return {"c": objective, "A_ub": a_ub, "b_ub": b_ub, "bounds": (0, None)}


def _summarise(
    result, classes: _Classes, levels: np.ndarray, model: ModelSpec, s_out: int, solve_s: float
) -> UpperBound:
    x = result.x[:-1].reshape(len(classes.count), len(levels), _VARS)
    tok_s = float(result.x[-1])
    flop_s = (2.0 * model.params_per_layer / classes.flops)[:, None]
    scan_s = (model.layer_bytes / classes.bandwidth)[:, None]
    prefill = float((x[..., 2] * flop_s).sum())
    decode = float((x[..., 1] * flop_s).sum())
    scans = float((x[..., 3] * scan_s).sum())
    total = float(classes.count.sum())
    scan_count = float(x[..., 3].sum())
    mean_batch = float(x[..., 1].sum()) / scan_count if scan_count > 0 else 0.0
    memory_dual = abs(float(result.ineqlin.marginals[-3]))  # the "one replica" row
    return UpperBound(
        tok_s,
        tok_s / s_out,
        prefill / total,
        decode / total,
        scans / total,
        mean_batch,
        memory_dual > 1e-9,
        solve_s,
    )
