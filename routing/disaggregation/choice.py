"""Disaggregate only where it pays: HexGen's colocated plan or HexGen-2's disaggregated one,
whichever serves more tokens/s on this cluster and workload.

HexGen-2 (§1, §2) disaggregates to remove prefill-decode interference and to give each phase
its own GPUs and parallel plan; it pays for that with whole copies of the weights in the
prefill replicas and the KV cache moved over links (Table 1). Which side wins depends on the
cluster and the workload: on HexGen-2's settings the two plans' simulated throughputs differ by
0.8-1.2 x either way (docs/benchmarks.md). So rather than disaggregate whenever asked, the
coordinator plans both and keeps the better:

1. both plans serve one trace: Poisson arrivals at `capacity.SATURATION` x the cluster's upper
   bound for `seconds` (`simulation.saturating_trace`, the workload's own seed), so queues only
   grow while requests arrive;
2. each is measured by its steady tokens/s in the saturated window (`steady_throughput`): the
   colocated plan in `serving_sim.py`, its prefills costing more next to decoding sequences by
   the interference measured on a live peer (`routing/scheduler/simulation/interference.py`), the
   disaggregated one in `simulation.py`, KV transfers and all;
3. the disaggregated plan is kept only if it serves strictly more; a colocated plan that the
   scheduler could not give (Petals' rule placed the peers) has no figure, and then the
   disaggregated plan is kept if it serves anything.

Plain data in and out: the coordinator (swarm/coordinator/planner.py `choose_planned`) and
benchmarks/disaggregation.py call `choose`, which does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexswarm.routing.disaggregation.plan_record import DisaggregatedPlan
from hexswarm.routing.disaggregation.simulation import (
    saturating_trace,
    simulate_colocated,
    simulate_disaggregated,
    steady_throughput,
)
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.plan import Plan
from hexswarm.routing.scheduler.plan_eval import plan_layouts
from hexswarm.routing.scheduler.simulation.interference import MEASURED, Interference
from hexswarm.routing.scheduler.simulation.simulator import Trace

TRACE_SECONDS = 120.0  # of arrivals: enough for the replicas to fill and a steady window after


@dataclass(frozen=True)
class Choice:
    """Which plan to keep, with both figures (simulated steady tokens/s on one trace)."""

    disaggregated: bool  # keep the disaggregated plan
    colocated_tok_s: float | None  # None: no colocated plan to score (Petals' rule)
    disaggregated_tok_s: float | None  # None: no disaggregated plan

    @property
    def chosen_tok_s(self) -> float:
        return (self.disaggregated_tok_s if self.disaggregated else self.colocated_tok_s) or 0.0

    @property
    def reason(self) -> str:
        """One line: what was kept and why, both figures in tok/s."""
        co, dis = _tok_s(self.colocated_tok_s), _tok_s(self.disaggregated_tok_s)
        if self.disaggregated_tok_s is None:
            return f"colocated ({co}; no disaggregated plan)"
        if self.colocated_tok_s is None:
            kept = "disaggregated" if self.disaggregated else "colocated"
            return f"{kept} ({dis} disaggregated; no colocated plan to compare)"
        ratio = self.disaggregated_tok_s / self.colocated_tok_s if self.colocated_tok_s else float("inf")
        if self.disaggregated:
            return f"disaggregated ({dis} against {co} colocated, {ratio:.2f} x)"
        return f"colocated ({co} against {dis} disaggregated, {ratio:.2f} x: disaggregating does not pay)"


def choose(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    colocated: Plan | None,
    disaggregated: DisaggregatedPlan | None,
    trace: Trace | None = None,
    interference: Interference | None = MEASURED,
    seconds: float = TRACE_SECONDS,
) -> Choice:
    """Scores both plans on one trace (`trace`, else a saturating one of `seconds`) and keeps the
    better (module docstring). Both plans' device ids must be `cluster`'s."""
    if colocated is None and disaggregated is None:
        raise ValueError("nothing to choose from: neither plan was given")
    if trace is None:
        trace = saturating_trace(cluster, model, workload, seconds)
    colocated_tok_s = disaggregated_tok_s = None
    if colocated is not None:
        layouts = plan_layouts(cluster, model, workload, colocated)
        done = simulate_colocated(cluster, model, layouts, trace, workload.max_batch, interference)
        colocated_tok_s = steady_throughput(trace, done)
    if disaggregated is not None:
        done = simulate_disaggregated(cluster, model, disaggregated, trace, workload)
        disaggregated_tok_s = steady_throughput(trace, done)
    if disaggregated_tok_s is None:
        keep = False
    elif colocated_tok_s is None:
        keep = disaggregated_tok_s > 0
    else:
        keep = disaggregated_tok_s > colocated_tok_s
    return Choice(keep, colocated_tok_s, disaggregated_tok_s)


def _tok_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} tok/s"
