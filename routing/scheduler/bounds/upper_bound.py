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
where P = parameters of a layer, B_l its bytes (in the device's weight format, `cost_model.py`),
c_d its FLOP/s and m_d its memory bandwidth.
Its memory holds x * (B_l + b * kv * t) bytes for b admitted sequences of t = s_in + s_out
tokens each (Eq. 7; kv = bytes of one token's K and V in one layer).

The LP. Identical devices are aggregated into classes g (n_g devices with the same M, m, c, B_l);
each class is split over batch levels k (b_k in 1..max_batch). Variables, per (g, k):
    N  devices of the class whose decode batches never exceed b_k
    Y  decode layer-tokens/s they process     Z  prefill layer-tokens/s
    W  weight scans/s, in layers (one decode step on x layer-equivalents is x scans)
    H  layer-equivalents of weights they hold
and T, the generated tokens/s (T / s_out completed requests per second). Maximise T s.t.
(`bound_lp.py` builds and solves the program, shared with `slo_bound.py`)
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

import numpy as np

from hexswarm.routing.scheduler.bounds.bound_lp import (
    DEFAULT_MAX_BATCH,
    BoundCells,
    UpperBound,
    batch_levels,
    level_caps,
    solve_bound,
)
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import device_layer_bytes
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload

__all__ = ["DEFAULT_MAX_BATCH", "UpperBound", "batch_levels", "throughput_upper_bound"]


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
    count, cells = _cells(cluster, model, workload, max_batch)
    return solve_bound(count, cells, model.num_layers, workload.s_out, (s_in, coupled))


def _cells(
    cluster: Cluster, model: ModelSpec, workload: Workload, max_batch: int
) -> tuple[np.ndarray, BoundCells]:
    """One cell per (class of identical devices, batch level), class-major."""
    figures = np.array(
        [(d.memory_bytes, d.bandwidth, d.flops, device_layer_bytes(d, model)) for d in cluster.devices],
        dtype=float,
    )
    if len(figures) == 0:
        raise ValueError("the cluster has no devices")
    unique, count = np.unique(figures, axis=0, return_counts=True)
    memory, bandwidth, flops, layer_bytes = unique.T
    levels = batch_levels(max_batch)
    tokens = workload.s_in_min + workload.s_out
    caps = level_caps(memory, levels, model, tokens, layer_bytes)  # Eq. 7, shortest request
    g, k = np.divmod(np.arange(len(unique) * len(levels)), len(levels))
    flop_s = 2.0 * model.params_per_layer / flops[g]  # seconds per layer-token
    scan_s = layer_bytes[g] / bandwidth[g]  # seconds per layer scan
    busy = np.column_stack((flop_s, flop_s, scan_s))
    return count.astype(float), BoundCells(g, levels[k], caps[g, k], busy)
