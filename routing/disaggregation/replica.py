"""Step (iii) of HexGen-2 §3.3: each group's parallel plan, and what it can serve.

The layout of a group is HexGen's: Algorithm 1's DP over its GPUs (`PipelineDP`, asymmetric TP
and PP, Eq. 7 memory caps), with the objective of its role (§3.3):

* prefill replicas are compute bound and gain nothing from batching, so their layout is the
  *latency-optimal* one: the DP on Eq. 2 for a prompt and one generated token;
* decode replicas are memory-I/O bound and gain from batching, so theirs is the
  *throughput-optimal* one: the DP's candidate layouts (its TP-degree variants and layer splits)
  ranked by `decode_capacity`, with per-layer costs of decode alone.

A node's capacity (Appendix A) is in requests per second, counted as the event simulation
(`simulation.py`) serves them, so that the max flow estimates what it measures:

* prefill: stages work on different prompts at once, one prompt each, so a replica completes a
  prompt per step of its slowest stage: 1 / max_j prefill_j at the mean prompt (fewer if its
  memory holds fewer prompts than it has stages);
* decode: with m sequences in the replica (at most what every stage's KV memory holds at the
  full context), each stage batches b = min(max_batch, ceil(m / S)); a token's pass takes the
  sum of the stage steps and hops, or ceil(m / b) steps of the slowest stage once that stage is
  always busy (m at most what the memory holds at the mean context, the longest must fit).
  Capacity is the best m / (s_out x pass) over m, and that m is the replica's limit on the
  sequences it decodes at once (`max_sequences`, in the plan). (the fluid model of `serving.loaded_latency` without prefill and without its
  burst factor: the planner saturates the replica).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hexswarm.routing.disaggregation.roles import DECODE, PREFILL
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP, PipelineLayout
from hexswarm.routing.scheduler.simulation.stage_costs import StageCosts, stage_costs


@dataclass(frozen=True, eq=False)
class Replica:
    """A group's plan in one role: its layout (None when it cannot hold the model) and capacity."""

    role: str
    devices: tuple[int, ...]
    layout: PipelineLayout | None
    capacity_rps: float
    max_sequences: int = 0  # decode: sequences it decodes at once (`decode_capacity`); prefill: 0


def prefill_capacity(costs: StageCosts, s_in_max: int) -> float:
    """Prompts per second of a prefill replica (module docstring); column 0 of `costs` is the
    mean prompt."""
    fit = costs.max_sequences(s_in_max + 1)
    if fit < 1:
        return 0.0
    slowest = float(costs.prefill_s[:, 0].max())
    one_pass = float(costs.prefill_s[:, 0].sum() + costs.hop_prefill_s[:, 0].sum())
    return min(1.0 / slowest, fit / one_pass)


def decode_capacity(costs: StageCosts, s_out: int, tokens: float, longest: int) -> tuple[float, int]:
    """(requests per second, sequences to decode at once) of a decode replica whose sequences
    hold `tokens` tokens of cache on average (module docstring); (0, 0) if it cannot hold the
    `longest`. The replica decodes at most that many sequences at once: more would make a
    short batch that costs a whole weight scan (with 69 sequences of OPT-30B on two A100
    stages, batches of 32, 32 and 5 served 25% less than 64 sequences do)."""
    fit = costs.max_sequences(tokens)
    if costs.max_sequences(longest) < 1 or fit < 1:
        return 0.0, 0
    stages, max_batch = costs.num_stages, costs.max_batch
    m = np.arange(1, min(fit, stages * max_batch + max_batch) + 1)
    b = np.minimum(max_batch, -(-m // stages))
    through = costs.step_s[:, b].sum(axis=0) + costs.hop_step_s[:, b].sum(axis=0)
    limit = -(-m // b) * costs.step_s[:, b].max(axis=0)
    rates = m / (s_out * np.maximum(through, limit))
    best = int(np.argmax(rates))
    return float(rates[best]), int(m[best])


def decode_microbatch(max_sequences: int, stages: int, max_batch: int) -> int:
    """Sequences per microbatch of a decode replica decoding `max_sequences` at once: b of
    `decode_capacity` (so ceil(max_sequences / b) microbatches rotate through its stages)."""
    return max(1, min(max_batch, -(-max_sequences // stages)))


PREFILL_LAYOUTS = ("latency", "throughput")


class ReplicaPlanner:
    """Lays out groups in either role and rates them, with caches: the refinement asks for the
    same groups again and again. `whole_machines`: a swarm, where a machine serves one stage.
    `prefill_layout="throughput"` ranks prefill layouts by prefill capacity instead of §3.3's
    latency (an ablation: pipelined prefill completes more prompts a second)."""

    def __init__(
        self,
        cluster: Cluster,
        model: ModelSpec,
        workload: Workload,
        whole_machines: bool = False,
        layout_cache: dict | None = None,
        prefill_layout: str = "latency",
    ):
        if prefill_layout not in PREFILL_LAYOUTS:
            raise ValueError(f"prefill_layout must be one of {PREFILL_LAYOUTS}, got {prefill_layout!r}")
        self.cluster, self.model = cluster, model
        self.workload = replace(workload, objective="throughput")
        cache = {} if layout_cache is None else layout_cache
        w = self.workload
        # prefill: Eq. 2 for the prompt and one token, i.e. the prefill latency (or, as an
        # ablation, the DP's layouts ranked by prefill capacity)
        score = self._prefill_score if prefill_layout == "throughput" else None
        self._prefill_dp = PipelineDP(
            cluster, model, replace(w, s_out=1), score=score, cache=cache, whole_buckets=whole_machines
        )
        # decode: per-layer costs of decode alone (one-token prompt), layouts ranked by capacity;
        # the capacities below use the real prompt's cache
        self._decode_dp = PipelineDP(
            cluster,
            model,
            replace(w, s_in=1, s_in_spread=0.0),
            score=self._decode_score,
            cache=cache,
            whole_buckets=whole_machines,
        )
        self._replicas: dict[tuple[str, tuple[int, ...]], Replica] = {}

    def replica(self, role: str, devices: tuple[int, ...]) -> Replica:
        """The group `devices` (sorted device indices) laid out and rated for `role`."""
        key = (role, devices)
        if key not in self._replicas:
            self._replicas[key] = self._plan(role, devices)
        return self._replicas[key]

    def costs(self, layout: PipelineLayout, role: str) -> StageCosts:
        """Per-stage costs at the workload's mean prompt (decode steps up to max_batch)."""
        batch = 1 if role == PREFILL else self.workload.max_batch
        return stage_costs(self.cluster, layout, self.model, [float(self.workload.s_in)], batch)

    def _plan(self, role: str, devices: tuple[int, ...]) -> Replica:
        if role not in (PREFILL, DECODE):
            raise ValueError(f"unknown role {role!r}")
        dp = self._prefill_dp if role == PREFILL else self._decode_dp
        layout = dp.layout(devices)
        if layout is None:
            return Replica(role, devices, None, 0.0)
        # the DP cost its layout at the role's own lengths; keep the workload's for the record
        layout = PipelineDP(self.cluster, self.model, self.workload).evaluate(layout.stages)
        return Replica(role, devices, layout, *self.capacity(layout, role))

    def capacity(self, layout: PipelineLayout, role: str) -> tuple[float, int]:
        """(requests per second, sequences decoded at once) of `layout` in `role` (module docstring)."""
        w = self.workload
        costs = self.costs(layout, role)
        if role == PREFILL:
            return prefill_capacity(costs, w.s_in_max), 0
        return decode_capacity(costs, w.s_out, w.s_in + w.s_out, w.s_in_max + w.s_out)

    def _prefill_score(self, layout: PipelineLayout) -> tuple:
        return (-self.capacity(layout, PREFILL)[0], layout.prefill_s)

    def _decode_score(self, layout: PipelineLayout) -> tuple:
        return (-self.capacity(layout, DECODE)[0], layout.decode_s)
