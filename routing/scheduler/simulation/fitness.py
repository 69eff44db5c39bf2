"""A fast analytic estimate of a plan under pipelined, batched serving: the genetic search's fitness.

The event simulation (`serving.py`) costs tens of milliseconds per plan; the search scores
thousands. HexGen's search needs only to rank candidates, so it scores them with the fluid
model the dispatcher already uses (`serving.loaded_latency`: per-stage utilisation, batching
and queueing as the number of requests in a pipeline grows):

1. Per pipeline, x(m) is the expected latency with m requests inside. By Little's law the
   pipeline then completes m / x(m) requests per second; its *SLO capacity* is the most it
   completes while x(m) stays within the deadline.
2. The offered rate is shared in proportion to SLO capacity. Attainment is the share of it the
   capacities cover, min(1, sum capacity / rate); the mean latency is each pipeline's x(m) at
   the smallest m that carries its share.

The benchmark reports how well this ranks and predicts plans against the event simulation
(`fitness_vs_sim`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout
from hexswarm.routing.scheduler.simulation.serving import loaded_latency
from hexswarm.routing.scheduler.simulation.stage_costs import stage_costs


@dataclass(frozen=True, eq=False)
class PipelineCapacity:
    """What one pipeline can carry within the deadline."""

    rates: np.ndarray  # (n,) requests/s completed with m = 1..n requests inside, all within the SLO
    latency_s: np.ndarray  # (n,) expected latency at those m

    @property
    def slo_rps(self) -> float:
        return float(self.rates.max()) if len(self.rates) else 0.0


@dataclass(frozen=True)
class Estimate:
    """The analytic fitness of a plan."""

    attainment: float
    goodput_rps: float
    mean_latency_s: float


def pipeline_capacity(
    cluster: Cluster, layout: PipelineLayout, model: ModelSpec, workload: Workload, deadline_s: float
) -> PipelineCapacity:
    """SLO capacity of one pipeline for requests of the workload's mean prompt length."""
    costs = stage_costs(cluster, layout, model, [float(workload.s_in)], workload.max_batch)
    table = loaded_latency(costs, workload.s_out, float(workload.s_in + workload.s_out), deadline_s)
    within = table <= deadline_s
    m = np.arange(1, len(table) + 1)[within]
    return PipelineCapacity(m / table[within], table[within])


def estimate(capacities: Sequence[PipelineCapacity], rate: float) -> Estimate:
    """Attainment, goodput and mean latency of pipelines sharing `rate` requests/s."""
    total = sum(c.slo_rps for c in capacities)
    if total <= 0:
        return Estimate(0.0, 0.0, float("inf"))
    carried = min(rate, total)
    weighted = 0.0
    for c in capacities:
        share = carried * c.slo_rps / total
        if share <= 0:
            continue
        first = int(np.argmax(c.rates >= share * (1 - 1e-9)))  # smallest m carrying the share
        weighted += share * float(c.latency_s[first])
    return Estimate(carried / rate, carried, weighted / carried)


def estimate_layouts(
    cluster: Cluster,
    layouts: Sequence[PipelineLayout],
    model: ModelSpec,
    workload: Workload,
    deadline_s: float,
) -> Estimate:
    """`estimate` of whole pipelines: each layout's SLO capacity, sharing the workload's rate."""
    return estimate(
        [pipeline_capacity(cluster, lay, model, workload, deadline_s) for lay in layouts], workload.rate
    )
