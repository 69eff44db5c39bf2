"""The most tokens/s *within the SLO* any placement could serve: `upper_bound.py`'s LP plus a deadline.

HexGen's objective is SLO attainment (§3, §4.3), but the bound of `upper_bound.py` (Helix-style,
Mei et al., ASPLOS 2025) has no deadline: its optimum keeps every GPU at tensor-parallel degree 1
with no communication, which a plan that must answer within the deadline often cannot do (80
layers of Llama-2-70B take > 140 ms per token on one RTX 3090 Ti each, 4.5 s for 32 tokens).
This bound charges what the deadline forces, and only what the cost model provably charges:

* Each device may serve in a TP group of n devices (n = 1, 2, ...). Per layer of a step, HexGen
  Eq. 5 charges the group 4 (alpha + size / beta) for each of its n - 1 peers; with alpha_d the
  lowest latency and beta_d the highest bandwidth from device d to any other device, that is at
  least 4 (n - 1) (alpha_d + b H B / (n beta_d)) (H: hidden size, B: bytes per value). The
  device is busy for it (a stage's step includes its all-reduce), so per layer-equivalent
  (see `upper_bound.py`) it adds 4 n (n - 1) alpha_d per scan, 4 (n - 1) H B / beta_d per decode
  token and 4 n (n - 1) alpha_d / s_in_max + 4 (n - 1) H B / beta_d per prompt token.
* Latency. A request that meets the deadline D spends at least, per layer of each of its s_out
  decode passes, lambda = (scan + FLOPs of one token) / n + all-reduce at batch 1 (a step of b >= 1
  tokens takes at least that; Eq. 4 and 5 at the device's own speed bound the group's, which runs
  at its slowest member's), and per layer of its prefill mu = s_in FLOPs / n + all-reduce.
  Summing over the met requests of a run, sum(latency) <= D x (met requests), and in the LP's
  per-second terms:  sum_cells (Y lambda + Z mu) <= D T / s_out.
  Hops, queueing and batching waits only add to a request's latency, so they are left out.

Everything else (classes, batch levels, memory, prefill/decode coupling) is `upper_bound.py`'s
LP, with a TP degree added to each cell; with no deadline and n = 1 it is that LP exactly. The
result bounds the tokens/s of the requests that met the deadline (counted over the time to the
last of them, as `capacity.slo_capacity_tok_s` does), for any plan and dispatcher; it is not a
bound on tokens/s that include late requests.

TP degrees: for each class, n runs from 1 while lambda or mu still falls; both are convex in n
(or increasing), so once both rise every larger n is dominated (slower, more busy time, same
memory) and leaving it out does not lower the bound.
"""

from __future__ import annotations

import math

import numpy as np

from hexswarm.routing.scheduler.bounds.bound_lp import (
    DEFAULT_MAX_BATCH,
    BoundCells,
    Deadline,
    UpperBound,
    batch_levels,
    level_caps,
    solve_bound,
)
from hexswarm.routing.scheduler.bounds.upper_bound import throughput_upper_bound
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import device_layer_bytes
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload

MAX_DEGREE = 64  # TP degrees tried per class at most (the convexity stop comes far earlier)


def slo_upper_bound(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    deadline_s: float,
    max_batch: int = DEFAULT_MAX_BATCH,
    prompt_tokens: float | None = None,
    coupled_prompt_tokens: float | None = None,
) -> UpperBound:
    """Upper bound on the generated tokens/s of requests finished within `deadline_s` (module docstring).

    `prompt_tokens` / `coupled_prompt_tokens` as in `upper_bound.throughput_upper_bound`, for the
    requests that met the deadline."""
    if max_batch < 1 or deadline_s <= 0:
        raise ValueError("max_batch must be at least 1 and deadline_s positive")
    s_in = float(workload.s_in_min if prompt_tokens is None else prompt_tokens)
    coupled = float(workload.s_in_min if coupled_prompt_tokens is None else coupled_prompt_tokens)
    if s_in < 0 or coupled < 0:
        raise ValueError("prompt_tokens and coupled_prompt_tokens must not be negative")
    if math.isinf(deadline_s):  # no deadline: every token counts, the plain bound
        return throughput_upper_bound(cluster, model, workload, max_batch, s_in, coupled)
    count, cells = _cells(cluster, model, workload, max_batch)
    return solve_bound(count, cells, model.num_layers, workload.s_out, (s_in, coupled), Deadline(deadline_s))


def _device_figures(cluster: Cluster, model: ModelSpec) -> np.ndarray:
    """(N, 6): memory, bandwidth, flops, lowest latency and highest bandwidth to another device,
    and one layer's weight bytes in the device's format."""
    n = len(cluster)
    if n == 0:
        raise ValueError("the cluster has no devices")
    off = ~np.eye(n, dtype=bool)
    alpha = np.where(off, cluster.latency, np.inf).min(axis=1) if n > 1 else np.full(1, np.inf)
    beta = np.where(off, cluster.bandwidth, 0.0).max(axis=1) if n > 1 else np.zeros(1)
    own = np.array([(d.memory_bytes, d.bandwidth, d.flops) for d in cluster.devices], dtype=float)
    layer_bytes = np.array([device_layer_bytes(d, model) for d in cluster.devices], dtype=float)
    return np.column_stack((own, alpha, beta, layer_bytes))


def _cells(
    cluster: Cluster, model: ModelSpec, workload: Workload, max_batch: int
) -> tuple[np.ndarray, BoundCells]:
    """One cell per (class, useful TP degree, batch level)."""
    figures, count = np.unique(_device_figures(cluster, model), axis=0, return_counts=True)
    levels = batch_levels(max_batch)
    caps = level_caps(figures[:, 0], levels, model, workload.s_in_min + workload.s_out, figures[:, 5])
    hb = model.hidden_size * model.dtype_bytes  # bytes of one token's activation
    rows = []
    for g, (_, bandwidth, flops, alpha, beta, layer_bytes) in enumerate(figures):
        scan, flop = layer_bytes / bandwidth, 2.0 * model.params_per_layer / flops
        for n in _degrees(scan, flop, alpha, beta, hb, workload, min(len(cluster), MAX_DEGREE)):
            ar_scan = 4 * n * (n - 1) * alpha if n > 1 else 0.0  # all-reduce latency, per scan
            ar_token = 4 * (n - 1) * hb / beta if n > 1 else 0.0  # ... bytes, per token
            ar_prompt = ar_token + ar_scan / workload.s_in_max  # ... per prompt token
            lam = (scan + flop) / n + (ar_scan + ar_token) / n  # per layer, per decode token
            mu = flop / n + ar_prompt / n  # per layer, per prompt token
            for k, b in enumerate(levels):
                rows.append((g, b, caps[g, k], flop + ar_token, flop + ar_prompt, scan + ar_scan, lam, mu))
    table = np.array(rows, dtype=float)
    cells = BoundCells(table[:, 0].astype(int), table[:, 1], table[:, 2], table[:, 3:6], table[:, 6:8])
    return count.astype(float), cells


def _degrees(scan, flop, alpha, beta, hb, workload: Workload, limit: int) -> list[int]:
    """TP degrees 1, 2, ... while the per-layer decode or prefill latency still falls (docstring)."""

    def latency(n: int) -> tuple[float, float]:
        if n == 1:
            return scan + flop, flop
        decode = (scan + flop) / n + 4 * (n - 1) * (alpha + hb / (n * beta))
        prefill = flop / n + 4 * (n - 1) * (alpha / workload.s_in_max + hb / (n * beta))
        return decode, prefill

    out, last = [1], latency(1)
    for n in range(2, limit + 1):
        now = latency(n)
        if now[0] > last[0] and now[1] > last[1]:
            break
        out.append(n)
        last = now
    return out
