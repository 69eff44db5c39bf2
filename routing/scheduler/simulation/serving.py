"""Scores a set of pipelines on a trace under the workload's serving model (the plan's ground truth).

* `serving="sequential"` — the first version's model, kept as an ablation: each pipeline is one
  server running one request at a time (`simulator.simulate`).
* `serving="pipelined-batched"` (default) — every pipeline is the event-driven simulation of
  `serving_sim.py`: stages work on different requests at once and batch up to
  `workload.max_batch` decode steps (`max_batch=1` gives pipelining alone).

Dispatch, as in AlpaServe (HexGen §4.3): requests go, on arrival, to the pipeline expected to
finish them first, and a request no pipeline is expected to finish within the deadline is
turned away at once. The expectation is a fluid estimate (`loaded_latency`) at the number of
requests each pipeline holds at that moment in the simulation; the event simulation then
decides the real completion times.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout
from hexswarm.routing.scheduler.simulation import serving_sim
from hexswarm.routing.scheduler.simulation.simulator import (
    SimResult,
    Trace,
    pipeline_latencies,
    simulate,
    summarize,
)
from hexswarm.routing.scheduler.simulation.stage_costs import StageCosts, stage_costs

MAX_IN_FLIGHT = 4096  # longest table of `loaded_latency`
BURST = 0.4  # latency grows by this share of the utilisation under Poisson bursts (fitted)


def evaluate_layouts(
    cluster: Cluster, layouts: Sequence[PipelineLayout], model: ModelSpec, trace: Trace, workload: Workload
) -> SimResult:
    """SLO attainment, goodput, latency and tokens/s of a set of pipelines on a trace."""
    if workload.serving == "sequential":
        matrix = pipeline_latencies(cluster, layouts, model, trace, workload.batch_size)
        return simulate(matrix, trace)
    costs = [stage_costs(cluster, layout, model, trace.s_in, workload.max_batch) for layout in layouts]
    return simulate_serving(costs, trace)


def simulate_serving(costs: Sequence[StageCosts], trace: Trace) -> SimResult:
    """Runs the trace through pipelines with these costs, dispatching as the module docstring says."""
    count = len(trace.arrivals)
    if not costs or count == 0:
        return SimResult(0.0, 0.0, float("inf"), 0, count)
    finish = serving_sim.simulate(
        costs, trace.arrivals, trace.s_in + trace.s_out, trace.s_out, Dispatcher(costs, trace)
    )
    served = np.isfinite(finish)
    latency = finish[served] - trace.arrivals[served]
    last = float(finish[served].max()) if served.any() else 0.0
    return summarize(latency, trace.s_in[served], trace, last)


class Dispatcher:
    """AlpaServe's choice: the pipeline expected to finish the request first, or none when no
    pipeline is expected to make the deadline. Expectations come from `loaded_latency`, at the
    number of requests the pipeline holds when the request arrives."""

    def __init__(self, costs: Sequence[StageCosts], trace: Trace):
        tokens = float(np.mean(trace.s_in)) + trace.s_out
        tables = [loaded_latency(c, trace.s_out, tokens, trace.deadline_s) for c in costs]
        self.width = max(len(t) for t in tables)
        self.latency = np.full((len(costs), self.width), np.inf)  # (P, n): n requests already in
        for p, table in enumerate(tables):
            self.latency[p, : len(table)] = table
        prefill = np.vstack([c.prefill_s.sum(axis=0) + c.hop_prefill_s.sum(axis=0) for c in costs])
        self.prefill_delta = prefill - prefill.mean(axis=1, keepdims=True)  # (P, R) vs the mean prompt
        self.rows = np.arange(len(costs))
        self.deadline_s = trace.deadline_s

    def __call__(self, r: int, in_flight: np.ndarray) -> int:
        expected = self.latency[self.rows, np.minimum(in_flight, self.width - 1)] + self.prefill_delta[:, r]
        p = int(np.argmin(expected))
        return p if expected[p] <= self.deadline_s else -1


def loaded_latency(costs: StageCosts, s_out: int, tokens: float, deadline_s: float) -> np.ndarray:
    """Expected latency of a request that finds n others in flight, for n = 0, 1, ... (fluid model).

    With m = n + 1 sequences sharing the pipeline, each stage batches b = min(max_batch,
    ceil(m / S)) of them; a token's pass takes the sum of the stage steps, or, once the busiest
    stage is the limit, ceil(m / b) of its steps: s_out passes make D. Prefills run first, so
    they take a share rho = (m / x) p of the busiest stage (m / x requests/s arrive by Little's
    law, p is that stage's prefill); the latency x = P + D / (1 - rho) (P: the whole prefill) is
    the larger root of x^2 - (P + m p + D) x + P m p = 0. Past the KV limit requests wait for a
    free slot, so the latency grows in proportion. Poisson arrivals come in bursts, which a
    fluid model does not see: the latency is raised by BURST x the utilisation (rate m / x over
    the pipeline's saturation rate), a factor fitted to the event simulation on §5.1's
    pipelines. The table stops past the deadline.
    """
    n_stages, max_batch = costs.num_stages, costs.max_batch
    fit = max(1, costs.max_sequences(tokens))
    prefill_stage = costs.prefill_s.mean(axis=1)
    whole = float(prefill_stage.sum() + costs.hop_prefill_s.mean(axis=1).sum())
    busiest = float(prefill_stage.max())
    m = np.arange(1, MAX_IN_FLIGHT + 1)  # requests in the pipeline, this one included
    active = np.minimum(m, fit)
    b = np.minimum(max_batch, -(-active // n_stages))
    through = costs.step_s[:, b].sum(axis=0) + costs.hop_step_s[:, b].sum(axis=0)
    limit = -(-active // b) * costs.step_s[:, b].max(axis=0)
    decode = s_out * np.maximum(through, limit)
    linear = whole + active * busiest + decode
    x = (linear + np.sqrt(np.maximum(linear**2 - 4 * whole * active * busiest, 0.0))) / 2
    latency = x * m / active
    rates = m / latency
    latency = latency * (1 + BURST * rates / rates.max())
    over = np.flatnonzero(latency > deadline_s)
    return latency[: over[0] + 1] if len(over) else latency
