"""Fitness of the genetic search's individuals (HexGen §4.3), cached per bucket vector.

An individual (a partition of devices into groups) is laid out group by group with
Algorithm 1 (`PipelineDP`) and then scored under the workload's serving model:

* `serving="sequential"`: the AlpaServe-style replay of `simulator.py` is exact and cheap, so
  it is the fitness itself.
* `serving="pipelined-batched"`: the analytic estimate of `fitness.py` ranks candidates during
  the search; `simulate()` runs the event simulation (`serving.py`), which the search uses to
  pick among its finalists and which the plan reports.

Fitness is (attainment, -mean latency): the share of requests within the SLO first, latency
to break ties. Under the throughput objective (`Workload.objective`, no deadline, a saturating
rate) the first term is the requests/s the plan serves instead, i.e. its capacity.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import (
    MAX_DP_STATES,
    PipelineDP,
    PipelineLayout,
    bucket_key,
    dp_states,
)
from hexswarm.routing.scheduler.search.ga_operators import Individual
from hexswarm.routing.scheduler.simulation.fitness import (
    Estimate,
    PipelineCapacity,
    estimate,
    pipeline_capacity,
)
from hexswarm.routing.scheduler.simulation.serving import evaluate_layouts
from hexswarm.routing.scheduler.simulation.simulator import (
    SimResult,
    make_trace,
    pipeline_latencies,
    simulate,
)

Fitness = tuple[float, float]  # (attainment, or requests/s without a deadline; -mean latency)


def estimated_score(est: Estimate, workload: Workload) -> float:
    """Fitness's first term from the analytic estimate: attainment, or requests/s carried."""
    return est.attainment if workload.has_deadline else est.goodput_rps


def simulated_score(result: SimResult, workload: Workload) -> float:
    """The same term from a simulation: attainment, or the requests/s it served."""
    return result.attainment if workload.has_deadline else result.throughput_tok_s / workload.s_out


class Evaluator:
    """Fitness of individuals: DP layouts per group, then the serving model (cached per bucket vector)."""

    def __init__(
        self,
        cluster: Cluster,
        model: ModelSpec,
        workload: Workload,
        layout_dp: type[PipelineDP] = PipelineDP,
        layout_cache: dict | None = None,
        whole_machines: bool = False,
    ):
        self.cluster, self.model, self.workload = cluster, model, workload
        self.trace = make_trace(model, workload)
        self.whole_machines = whole_machines  # swarm: a machine serves at most one stage
        score = None if self.sequential else self._capacity_score
        self.dp = layout_dp(
            cluster, model, workload, score=score, cache=layout_cache, whole_buckets=whole_machines
        )
        keys = [bucket_key(cluster, i) for i in range(len(cluster))]
        ids = {k: n for n, k in enumerate(sorted(set(keys)))}
        self.bucket_of = [ids[k] for k in keys]
        self._group: dict[tuple, np.ndarray | PipelineCapacity | None] = {}
        self._fitness: dict[tuple, Fitness] = {}
        self._simulated: dict[tuple, SimResult] = {}
        self._scores: dict[tuple, tuple[float, float]] = {}
        self.evaluations = 0

    @property
    def sequential(self) -> bool:
        return self.workload.serving == "sequential"

    def group_signature(self, group: Sequence[int]) -> tuple:
        counts: dict[int, int] = {}
        for d in group:
            counts[self.bucket_of[d]] = counts.get(self.bucket_of[d], 0) + 1
        return tuple(sorted(counts.items()))

    def key(self, ind: Individual) -> tuple:
        return tuple(sorted(self.group_signature(g) for g in ind))

    def accept_group(self, group: Sequence[int]) -> bool:
        """Cheap check that keeps the DP's state space (`pipeline_dp.dp_states`) bounded."""
        counts = [count for _, count in self.group_signature(group)]
        return dp_states(counts, self.whole_machines) <= MAX_DP_STATES

    def layouts(self, ind: Individual) -> list[PipelineLayout]:
        out = []
        for group in ind:
            layout = self.dp.layout(group) if self.accept_group(group) else None
            if layout is not None:
                out.append(layout)
        return out

    def fitness(self, ind: Individual) -> Fitness:
        key = self.key(ind)
        if key not in self._fitness:
            self.evaluations += 1
            rows = [r for r in (self._group_score(g) for g in ind) if r is not None]
            if self.sequential:
                matrix = np.vstack(rows) if rows else np.empty((0, len(self.trace.arrivals)))
                result = simulate(matrix, self.trace)
                self._simulated[key] = result
                score, latency = simulated_score(result, self.workload), result.mean_latency_s
            else:
                est = estimate(rows, self.workload.rate)
                score, latency = estimated_score(est, self.workload), est.mean_latency_s
            self._fitness[key] = (score, -latency if np.isfinite(latency) else -np.inf)
        return self._fitness[key]

    def simulate(self, ind: Individual) -> SimResult:
        """The serving model's full simulation of an individual (event-driven unless sequential)."""
        key = self.key(ind)
        if key not in self._simulated:
            layouts = self.layouts(ind)
            self._simulated[key] = evaluate_layouts(
                self.cluster, layouts, self.model, self.trace, self.workload
            )
        return self._simulated[key]

    def _capacity_score(self, layout: PipelineLayout) -> tuple[float, float]:
        """Layouts by SLO capacity (more is better), then latency (for the DP; cached per layout)."""
        key = tuple((s.devices, s.start, s.end) for s in layout.stages)
        if key not in self._scores:
            capacity = pipeline_capacity(
                self.cluster, layout, self.model, self.workload, self.trace.deadline_s
            )
            self._scores[key] = (-capacity.slo_rps, layout.latency_s)
        return self._scores[key]

    def _group_score(self, group: Sequence[int]):
        """Per group: its service times on the trace (sequential) or its SLO capacity."""
        key = self.group_signature(group)
        if key not in self._group:
            layout = self.dp.layout(group) if self.accept_group(group) else None
            if layout is None:
                self._group[key] = None
            elif self.sequential:
                w = self.workload
                self._group[key] = pipeline_latencies(
                    self.cluster, [layout], self.model, self.trace, w.batch_size
                )[0]
            else:
                self._group[key] = pipeline_capacity(
                    self.cluster, layout, self.model, self.workload, self.trace.deadline_s
                )
        return self._group[key]
