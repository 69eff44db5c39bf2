"""SLO attainment of a set of pipelines under Poisson arrivals (AlpaServe-style, HexGen §4.3/§5.1).

HexGen estimates the SLO of a candidate with AlpaServe's simulator. This is that simulator
reduced to what HexGen serves: each pipeline is one server that runs one request at a time
(no batching, HexGen Appendix D), with a request's service time from the cost model (Eq. 2)
at its own prompt length. Requests arrive as a Poisson process (exponential gaps, §5.1), are
dispatched on arrival to the pipeline that would finish them first (first-come first-served
queues), and, as in AlpaServe, a request that cannot finish within its deadline on any
pipeline is rejected at once instead of queueing and delaying the others. The deadline is
`slo_scale` x the reference latency (the A100 latency of `cost_model.reference_latency`).

This is the `serving="sequential"` ablation; `serving.py` has the default pipelined and
batched model and dispatches to either.
The same trace (seeded) is replayed for every candidate so comparisons are paired.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import StageSpec, pipeline_cost, reference_latency
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout


@dataclass(frozen=True, eq=False)
class Trace:
    """Request arrivals (s) and prompt lengths, with the deadline every request must meet."""

    arrivals: np.ndarray  # (R,) seconds, increasing
    s_in: np.ndarray  # (R,) prompt tokens
    s_out: int
    deadline_s: float

    @property
    def duration_s(self) -> float:
        return float(self.arrivals[-1]) if len(self.arrivals) else 0.0


@dataclass(frozen=True)
class SimResult:
    """What a trace saw: share of requests within the SLO and their rate."""

    attainment: float  # requests finished within the deadline / all requests
    goodput_rps: float  # requests finished within the deadline per second of trace
    mean_latency_s: float  # over the requests served (inf when none was)
    served: int  # requests admitted and completed (on time or late)
    rejected: int  # requests turned away at dispatch
    p99_latency_s: float = float("inf")  # over the requests served
    throughput_tok_s: float = 0.0  # output tokens of served requests / time of the last completion
    served_prompt_tokens: float = 0.0  # mean prompt of the served requests (what the bound needs)


def make_trace(model: ModelSpec, workload: Workload) -> Trace:
    """A seeded Poisson trace of `workload.num_requests` requests (HexGen §5.1); its deadline is
    infinite under the throughput objective."""
    rng = np.random.default_rng(workload.seed)
    gaps = rng.exponential(1.0 / workload.rate, size=workload.num_requests)
    lengths = rng.integers(workload.s_in_min, workload.s_in_max + 1, size=workload.num_requests)
    unit = workload.reference_s or reference_latency(
        model, float(workload.s_in), workload.s_out, workload.batch_size
    )
    deadline = workload.slo_scale * unit if workload.has_deadline else math.inf
    return Trace(np.cumsum(gaps), lengths.astype(float), workload.s_out, deadline)


def pipeline_latencies(
    cluster: Cluster, layouts: Sequence[PipelineLayout], model: ModelSpec, trace: Trace, batch: int = 1
) -> np.ndarray:
    """(P, R) service time of every request on every pipeline, from Eq. 2 at its prompt length."""
    out = np.empty((len(layouts), len(trace.s_in)))
    for p, layout in enumerate(layouts):
        specs = [StageSpec(s.devices, s.layers) for s in layout.stages]
        out[p] = pipeline_cost(cluster, specs, model, trace.s_in, trace.s_out, batch).total
    return out


def simulate(latencies: np.ndarray, trace: Trace) -> SimResult:
    """Replays the trace over pipelines whose service times are `latencies` (P, R)."""
    count = len(trace.arrivals)
    if latencies.shape[0] == 0 or count == 0:
        return SimResult(0.0, 0.0, float("inf"), 0, count)
    free = [0.0] * latencies.shape[0]
    columns = latencies.T.tolist()  # per request: service time on each pipeline
    arrivals = trace.arrivals.tolist()
    deadline = trace.deadline_s
    latencies_s, served, last = [], [], 0.0
    for r, (arrival, service) in enumerate(zip(arrivals, columns, strict=False)):
        best_p, best_finish = -1, arrival + deadline
        for p, (busy_until, s) in enumerate(zip(free, service, strict=False)):
            finish = (busy_until if busy_until > arrival else arrival) + s
            if finish <= best_finish:
                best_p, best_finish = p, finish
        if best_p >= 0:
            free[best_p] = best_finish
            latencies_s.append(best_finish - arrival)
            served.append(r)
            last = max(last, best_finish)
    return summarize(np.asarray(latencies_s), trace.s_in[served], trace, last)


def summarize(
    served_latency_s: np.ndarray, served_s_in: np.ndarray, trace: Trace, last_s: float
) -> SimResult:
    """SimResult from the latencies of the served requests.

    Those within the deadline count for attainment and goodput. Throughput counts every served
    request's s_out tokens over [0, last completion], the window in which they were generated.
    """
    count = len(trace.arrivals)
    met = int(np.count_nonzero(served_latency_s <= trace.deadline_s * (1 + 1e-9)))
    served = len(served_latency_s)
    duration = max(trace.duration_s, 1e-9)
    mean = float(served_latency_s.mean()) if served else float("inf")
    p99 = float(np.percentile(served_latency_s, 99)) if served else float("inf")
    tokens = served * trace.s_out / last_s if served and last_s > 0 else 0.0
    prompt = float(served_s_in.mean()) if served else 0.0
    return SimResult(met / count, met / duration, mean, served, count - served, p99, tokens, prompt)
