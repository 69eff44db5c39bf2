"""Per-stage costs of one pipeline as the serving simulator needs them (HexGen Table 1, split by step).

`cost_model.pipeline_cost` gives the latency of a whole request (Eq. 2). A pipelined, batched
server needs the same terms cut the other way, per stage and per step:

* `prefill_s[j]`   — stage j's prefill of each request (Eq. 4 + Eq. 5 prefill terms), an
                     array over the trace's prompt lengths; prefill always runs one request.
* `step_s[j][b]`   — stage j's decode step for a batch of b sequences: one scan of its
                     weights plus b times the FLOPs (Eq. 4 decode at s_out = 1) plus the TP
                     all-reduce of b tokens (Eq. 5). Index 0 is unused.
* `hop_prefill_s[j]`, `hop_step_s[j][b]` — the activation hop from stage j to j+1 (Eq. 6).
                     Hops delay a request but do not occupy the stage (the send overlaps the
                     next step's compute).
* `kv_budget[j]`   — bytes per device left for KV cache and activations once the weights are
                     in (M_d - Eq. 7 at zero tokens), and `kv_per_token[j]` what one token of
                     one sequence takes (the b (s_in + s_out) terms of Eq. 7 at b = 1).

With b = 1 a request alone in the pipeline takes exactly Eq. 2's latency: prefill through every
stage, then s_out passes of one decode step each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import (
    comp_cost,
    pp_comm_cost,
    stage_layer_bytes,
    stage_memory,
    tp_comm_cost,
)
from hexswarm.routing.scheduler.model_spec import ModelSpec
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout


@dataclass(frozen=True, eq=False)
class StageCosts:
    """Costs of every stage of one pipeline, for steps of 1..max_batch sequences."""

    prefill_s: np.ndarray  # (S, R) seconds, per stage and request
    step_s: np.ndarray  # (S, max_batch + 1) seconds; column b = a decode step of b sequences
    hop_prefill_s: np.ndarray  # (S, R) seconds to the next stage; 0 after the last
    hop_step_s: np.ndarray  # (S, max_batch + 1)
    kv_budget: np.ndarray  # (S,) bytes per device free for KV cache
    kv_per_token: np.ndarray  # (S,) bytes per device per token of one sequence

    @property
    def num_stages(self) -> int:
        return len(self.step_s)

    @property
    def max_batch(self) -> int:
        return self.step_s.shape[1] - 1

    def latency_s(self, request: int, s_out: int) -> float:
        """A request alone in the pipeline (Eq. 2): prefill pass, then s_out one-sequence passes."""
        prefill = self.prefill_s[:, request].sum() + self.hop_prefill_s[:, request].sum()
        return float(prefill + s_out * (self.step_s[:, 1].sum() + self.hop_step_s[:, 1].sum()))

    def max_sequences(self, tokens: float) -> int:
        """How many sequences of `tokens` tokens fit in every stage's KV budget at once."""
        return int(np.min(self.kv_budget // (self.kv_per_token * tokens)))


def stage_costs(
    cluster: Cluster,
    layout: PipelineLayout,
    model: ModelSpec,
    s_in: np.ndarray | Sequence[float],
    max_batch: int,
) -> StageCosts:
    """Tabulates a pipeline's per-stage costs for the prompt lengths `s_in` and batches 1..max_batch."""
    if max_batch < 1:
        raise ValueError("max_batch must be at least 1")
    s_in = np.asarray(s_in, dtype=float)
    stages = layout.stages
    n_stages, batches = len(stages), np.arange(1, max_batch + 1)
    prefill = np.zeros((n_stages, len(s_in)))
    hop_prefill = np.zeros_like(prefill)
    step = np.zeros((n_stages, max_batch + 1))
    hop_step = np.zeros_like(step)
    budget, per_token = np.zeros(n_stages), np.zeros(n_stages)
    for j, stage in enumerate(stages):
        devs, layers = stage.devices, stage.layers
        prefill[j] = (
            comp_cost(cluster, devs, model, layers, s_in, 1).prefill
            + tp_comm_cost(cluster, devs, model, layers, s_in, 1).prefill
        )
        step[j, 1:] = (
            comp_cost(cluster, devs, model, layers, 0.0, 1, batches).decode
            + tp_comm_cost(cluster, devs, model, layers, 0.0, 1, batches).decode
        )
        if j + 1 < n_stages:
            nxt = stages[j + 1].devices
            hop_prefill[j] = pp_comm_cost(cluster, devs, nxt, model, s_in, 1).prefill
            hop_step[j, 1:] = pp_comm_cost(cluster, devs, nxt, model, 0.0, 1, batches).decode
        tp = len(devs)
        layer_bytes = stage_layer_bytes(cluster, devs, model)
        weights = stage_memory(model, tp, layers, 0, 1, layer_bytes)
        budget[j] = min(cluster.devices[d].memory_bytes for d in devs) - weights
        per_token[j] = stage_memory(model, tp, layers, 1, 1, layer_bytes) - weights
    return StageCosts(prefill, step, hop_prefill, hop_step, budget, per_token)
