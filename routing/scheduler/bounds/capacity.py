"""A plan's capacity: the tokens/s it serves in the event simulation when offered more than it can.

`bound_ratio` compares a plan with `upper_bound.py`, the most any placement could serve. A plan's
throughput at a given offered rate cannot reach the bound when that rate is below the bound (it
serves at most what arrives), so the ratio is taken on the plan's *capacity* instead: the same
simulation (`serving.py`) fed a saturating trace, `SATURATION` x the bound's request rate.

Two capacities, both measured on that trace:

* `capacity_tok_s` — every request is admitted (no deadline): the dispatcher sends each to the
  pipeline expected to finish it first and never turns one away, so the pipelines run with full
  queues. The bound has no SLO either, so `bound_ratio = capacity_tok_s / bound` compares like
  with like: how much of the cluster's compute, bandwidth and memory the placement can use.
* `slo_capacity_tok_s` — the SLO dispatcher of `serving.py` is on: requests no pipeline is
  expected to finish within the deadline are turned away, and only the requests that finish
  within it count (their output tokens over the time to the last of them; one late straggler
  would otherwise set the whole run's length). This is what the plan delivers at the SLO under
  overload; its share of the bound shows what the deadline costs.

`slo_upper_bound_tok_s` (`slo_bound.py`) bounds the second: the most tokens/s within the
deadline any placement could serve, for the prompts of the requests that met it.

The bound these are compared with charges prefill the smaller of the two runs' mean served
prompts (`upper_bound.py`, relaxation 6) and couples each device's prefill to its decode at
the shortest mean prompt any one pipeline served in either run, so it holds for both.

Throughput is served output tokens over [0, last completion] (`simulator.summarize`), so the
pipelines' fill at the start and the drain at the end are charged: a trace of `seconds` of
arrivals at `SATURATION` x the bound keeps the queues full for most of the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from hexswarm.routing.scheduler.bounds.slo_bound import slo_upper_bound
from hexswarm.routing.scheduler.bounds.upper_bound import throughput_upper_bound
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import tp_comm_cost
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP, PipelineLayout, StageLayout
from hexswarm.routing.scheduler.simulation import serving_sim
from hexswarm.routing.scheduler.simulation.serving import Dispatcher, evaluate_layouts
from hexswarm.routing.scheduler.simulation.simulator import SimResult, Trace, make_trace, summarize
from hexswarm.routing.scheduler.simulation.stage_costs import stage_costs

SATURATION = 1.5  # offered rate, x the bound's request rate: more than any plan can serve
TRACE_SECONDS = 20.0  # seconds of arrivals in the saturating trace
MAX_REQUESTS = 20000  # cap on the trace's length (the simulation is linear in it)


@dataclass(frozen=True)
class Capacity:
    """Tokens/s of a plan under a saturating offered rate."""

    capacity_tok_s: float  # every request admitted (no deadline)
    slo_capacity_tok_s: float  # the SLO dispatcher turns requests away
    offered_rps: float  # the saturating rate both were measured at
    upper_bound_tok_s: float  # the bound for the prompts both runs served
    slo_upper_bound_tok_s: float = 0.0  # the bound within the deadline (`slo_bound.py`)

    @property
    def bound_ratio(self) -> float:
        return self.capacity_tok_s / self.upper_bound_tok_s if self.upper_bound_tok_s > 0 else 0.0

    @property
    def slo_bound_ratio(self) -> float:
        """SLO capacity over the deadline-aware bound."""
        return self.slo_capacity_tok_s / self.slo_upper_bound_tok_s if self.slo_upper_bound_tok_s > 0 else 0.0


def bound_max_batch(workload: Workload) -> int:
    """The serving model's batch limit (sequential serving batches nothing)."""
    return 1 if workload.serving == "sequential" else workload.max_batch


def saturating_rate(cluster: Cluster, model: ModelSpec, workload: Workload) -> float:
    """`SATURATION` x the cluster's bound in requests/s (0 when nothing fits): more than any plan serves."""
    max_batch = bound_max_batch(workload)
    return (
        SATURATION
        * throughput_upper_bound(cluster, model, workload, max_batch, float(workload.s_in)).requests_s
    )


def saturating_workload(cluster: Cluster, model: ModelSpec, workload: Workload) -> Workload:
    """The workload at the saturating rate: what the search offers under the throughput
    objective, so that a plan's served tokens/s is its capacity."""
    rate = saturating_rate(cluster, model, workload)
    return replace(workload, rate=rate) if rate > 0 else workload


def plan_capacity(
    cluster: Cluster,
    layouts: Sequence[PipelineLayout],
    model: ModelSpec,
    workload: Workload,
    seconds: float = TRACE_SECONDS,
) -> Capacity:
    """Capacity of the pipelines `layouts` and the bound it is compared with (module docstring)."""
    max_batch = bound_max_batch(workload)
    rate = saturating_rate(cluster, model, workload)
    if rate <= 0 or not layouts:
        return Capacity(0.0, 0.0, 0.0, 0.0)
    count = max(200, min(MAX_REQUESTS, round(rate * seconds)))
    saturated = replace(workload, rate=rate, num_requests=count)
    trace = make_trace(model, saturated)
    slo, slo_coupled, met_coupled = _with_slo(cluster, layouts, model, trace, saturated)
    every = _admit_all(cluster, layouts, model, workload, seconds)
    prompts = [r.served_prompt_tokens for r in (slo, every) if r.served]
    coupled = min(slo_coupled, every.served_prompt_tokens) if every.served else slo_coupled
    bound = throughput_upper_bound(cluster, model, workload, max_batch, min(prompts, default=None), coupled)
    met_prompt = slo.served_prompt_tokens if slo.served else None
    within = slo_upper_bound(cluster, model, workload, trace.deadline_s, max_batch, met_prompt, met_coupled)
    return Capacity(every.throughput_tok_s, slo.throughput_tok_s, rate, bound.tok_s, within.tok_s)


def _with_slo(
    cluster: Cluster, layouts: Sequence[PipelineLayout], model: ModelSpec, trace: Trace, workload: Workload
) -> tuple[SimResult, float, float]:
    """The SLO dispatcher's run counted over the requests that met the SLO (tokens over the time
    to the last of them), and the shortest mean prompt one pipeline was given in it, of all its
    requests and of those that met the SLO (the bounds' coupling, `upper_bound.py`; s_in_min for
    sequential serving, which does not say; there every request served meets the SLO)."""
    if workload.serving == "sequential":
        shortest = float(workload.s_in_min)
        return evaluate_layouts(cluster, layouts, model, trace, workload), shortest, shortest
    costs = [stage_costs(cluster, lay, model, trace.s_in, workload.max_batch) for lay in layouts]
    dispatcher = Dispatcher(costs, trace)
    chosen = np.full(len(trace.arrivals), -1)

    def choose(r: int, in_flight: np.ndarray) -> int:
        chosen[r] = dispatcher(r, in_flight)
        return int(chosen[r])

    finish = serving_sim.simulate(costs, trace.arrivals, trace.s_in + trace.s_out, trace.s_out, choose)
    met = finish - trace.arrivals <= trace.deadline_s * (1 + 1e-9)  # inf (turned away) is never met
    last = float(finish[met].max()) if met.any() else 0.0
    result = summarize(finish[met] - trace.arrivals[met], trace.s_in[met], trace, last)
    shortest = float(workload.s_in_min)
    means = [float(trace.s_in[chosen == p].mean()) for p in range(len(costs)) if (chosen == p).any()]
    met_means = [
        float(trace.s_in[met & (chosen == p)].mean())
        for p in range(len(costs))
        if (met & (chosen == p)).any()
    ]
    return result, min(means, default=shortest), min(met_means, default=shortest)


def _admit_all(
    cluster: Cluster, layouts: Sequence[PipelineLayout], model: ModelSpec, workload: Workload, seconds: float
) -> SimResult:
    """Every request served, each pipeline fed its own saturating trace: the sum of what the
    pipelines serve alone is what an ideal dispatcher gets from them (they share nothing).

    Each pipeline's trace runs at SATURATION x the bound of its own devices, which sum to at
    most the cluster's bound (the LP's solutions for disjoint device sets add up to one for
    their union), so the ratio stays <= 1 whenever each pipeline stays under its own bound."""
    tokens, prompts, served = 0.0, [], 0
    for layout in layouts:
        devices = cluster.subset(frozenset(cluster.devices[d].id for d in layout.devices))
        own = [PipelineDP(devices, model, workload).evaluate(_moved(devices, cluster, layout))]
        rate = saturating_rate(devices, model, workload)
        alone = replace(workload, rate=rate, num_requests=max(100, min(MAX_REQUESTS, round(rate * seconds))))
        trace = make_trace(model, alone)
        result = evaluate_layouts(devices, own, model, replace(trace, deadline_s=math.inf), alone)
        tokens += result.throughput_tok_s
        if result.served:
            prompts.append(result.served_prompt_tokens)
        served += result.served
    # the shortest mean prompt any pipeline served: the cluster's bound at it holds for every one
    return SimResult(1.0, 0.0, 0.0, served, 0, 0.0, tokens, min(prompts, default=0.0))


def _moved(devices: Cluster, cluster: Cluster, layout: PipelineLayout) -> list[StageLayout]:
    """The layout's stages with device indices of `cluster` turned into those of `devices`."""
    index = {d.id: i for i, d in enumerate(devices.devices)}
    return [
        StageLayout(tuple(index[cluster.devices[d].id] for d in s.devices), s.start, s.end)
        for s in layout.stages
    ]


def allreduce_share(
    cluster: Cluster, layouts: Sequence[PipelineLayout], model: ModelSpec, workload: Workload
) -> float:
    """Share of the plan's saturated work spent in TP all-reduce (HexGen Eq. 5), which the bound
    does not charge (`upper_bound.py`, relaxation 3): per pipeline, its busiest stage's seconds
    per request at full batches (prefill + s_out / max_batch decode steps) and the all-reduce
    part of them, averaged over the pipelines weighted by their rate (1 / those seconds)."""
    batch, s_in, s_out = bound_max_batch(workload), float(workload.s_in), workload.s_out
    rates, shares = [], []
    for layout in layouts:
        costs = stage_costs(cluster, layout, model, [s_in], batch)
        work = costs.prefill_s[:, 0] + s_out / batch * costs.step_s[:, batch]
        j = int(np.argmax(work))
        stage = layout.stages[j]
        prefill = tp_comm_cost(cluster, stage.devices, model, stage.layers, s_in, 1).prefill
        step = tp_comm_cost(cluster, stage.devices, model, stage.layers, 0.0, 1, batch).decode
        rates.append(1.0 / work[j])
        shares.append((prefill + s_out / batch * step) / work[j])
    return float(np.dot(rates, shares) / sum(rates)) if rates else 0.0
