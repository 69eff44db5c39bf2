"""An hour of a churning swarm under one policy, scored by the pipelined serving simulator.

The run replays a `churn_process.Churn` (joins and leaves) and asks the policy for decisions at
every event and every `tick_s` (`churn_policy.py`). A peer given a new range is unavailable
until it has loaded it, `moves.load_seconds` after the decision, plus the re-plan's own wall
time when the decision needed one (the coordinator publishes only when its search is done).
How a peer moves depends on the policy. A Petals server restarts: it drops its blocks, loads
all of its new range and serves nothing meanwhile. A hexswarm peer moves make-before-break
(peer/range_move.py): it loads the whole new range as a second stack while its old range keeps
serving, then switches; when its memory cannot hold both ranges (or its TP group changes) it
drops the layers it will not keep and loads the missing ones, serving nothing meanwhile.
The layout chosen at t = 0 counts as loaded before the run (the swarm is already serving).
Every `sample_s` seconds, the peers that are present and loaded are decomposed into disjoint
chains (`span_chains.decompose`, the same rule for every policy), and the requests of the shared
trace that arrive in the next `window_s` seconds are served by those chains in the event
simulation (`serving.simulate_serving`). Attainment is the share of those requests that finish
within the SLO; throughput the generated tokens of served requests per second of window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hexswarm.routing.scenarios.churn_process import Churn
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP
from hexswarm.routing.scheduler.replan.moves import DEFAULT_LOAD_BANDWIDTH, Assignment, both_fit, load_seconds
from hexswarm.routing.scheduler.simulation.serving import simulate_serving
from hexswarm.routing.scheduler.simulation.simulator import Trace
from hexswarm.routing.scheduler.simulation.stage_costs import stage_costs
from hexswarm.routing.sim.churn_policy import Policy, SwarmView
from hexswarm.routing.sim.span_chains import PeerSpan, decompose


@dataclass(frozen=True)
class Sampling:
    """When and how the layout is scored, and how decisions are timed."""

    sample_s: float = 30.0  # a layout is scored every this many seconds
    window_s: float = 8.0  # on the requests arriving in this long a window
    tick_s: float = 5.0  # policies are asked this often besides at events
    period_s: float = 300.0  # results are reported per period
    load_bandwidth: float = DEFAULT_LOAD_BANDWIDTH


@dataclass
class PolicyRun:
    """What one policy achieved: per sample (time, met, requests, tokens/s), moves, re-plan times."""

    name: str
    samples: list[tuple[float, int, int, float]] = field(default_factory=list)
    moves: int = 0
    moves_serving: int = 0  # of which peers that were in a complete chain (the others idled)
    loads: int = 0  # ranges loaded by peers that had none (joiners, idle peers)
    loaded_gb: float = 0.0  # weights loaded after t = 0, by every peer
    moved_gb: float = 0.0  # of which by peers that had a range (moves)
    replan_s: list[float] = field(default_factory=list)  # wall clock
    replan_cpu_s: list[float] = field(default_factory=list)
    serving_gpus: list[int] = field(default_factory=list)  # per sample: GPUs in complete chains

    def attainment(self) -> float:
        requests = sum(s[2] for s in self.samples)
        return sum(s[1] for s in self.samples) / requests if requests else 0.0

    def throughput(self) -> float:
        return float(np.mean([s[3] for s in self.samples])) if self.samples else 0.0

    def split_attainment(self, leave_times: list[float], after_s: float) -> dict[str, float | int]:
        """Attainment of the samples within `after_s` after a leave vs the others (steady)."""
        leaves = np.sort(np.asarray(leave_times, dtype=float))
        after, steady = [], []
        for sample in self.samples:
            k = int(np.searchsorted(leaves, sample[0], side="right"))
            recent = k > 0 and sample[0] - leaves[k - 1] <= after_s
            (after if recent else steady).append(sample)

        def share(rows):
            requests = sum(r[2] for r in rows)
            return round(sum(r[1] for r in rows) / requests, 4) if requests else 0.0

        return {
            "after_leave": share(after),
            "steady": share(steady),
            "after_leave_samples": len(after),
            "steady_samples": len(steady),
        }

    def per_period(self, period_s: float) -> tuple[list[float], list[float]]:
        """Attainment and mean tokens/s per period of `period_s`."""
        periods: dict[int, list] = {}
        for sample in self.samples:
            periods.setdefault(int(sample[0] // period_s), []).append(sample)
        att, tok = [], []
        for k in sorted(periods):
            rows = periods[k]
            requests = sum(r[2] for r in rows)
            att.append(sum(r[1] for r in rows) / requests if requests else 0.0)
            tok.append(float(np.mean([r[3] for r in rows])))
        return att, tok


def run(
    churn: Churn,
    policy: Policy,
    model: ModelSpec,
    workload: Workload,
    trace: Trace,
    sampling: Sampling = Sampling(),
) -> PolicyRun:
    """Replays the churn under `policy` (module docstring)."""
    out = PolicyRun(policy.name)
    present = set(churn.initial)
    spans: dict[str, PeerSpan] = {}  # each peer's range (loaded or loading)
    ready: dict[str, float] = {}  # when it is loaded
    before: dict[str, PeerSpan] = {}  # the range a moving peer keeps serving until then
    joined, left = list(churn.initial), []
    events = list(churn.events)
    ticks = np.arange(0.0, churn.duration_s, sampling.tick_s).tolist()
    samples = set(np.arange(0.0, churn.duration_s - sampling.window_s + 1e-9, sampling.sample_s).tolist())
    times = sorted(set(ticks) | samples | {e.time_s for e in events})
    position = 0
    for now in times:
        while position < len(events) and events[position].time_s <= now:
            event = events[position]
            position += 1
            if event.kind == "join":
                present.add(event.machine)
                joined.append(event.machine)
            else:
                present.discard(event.machine)
                for peer in _peers_of(spans, churn.devices[event.machine]):
                    spans.pop(peer)
                    before.pop(peer, None)
                left.append(event.machine)
        cluster = churn.cluster(present)
        machines = {m: churn.devices[m] for m in sorted(present)}
        loaded = frozenset(m for m in spans if ready.get(m, 0.0) <= now)
        view = SwarmView(now, cluster, machines, dict(spans), tuple(joined), tuple(left), loaded)
        decision = policy.decide(view)
        joined, left = [], []
        delay = decision.replan_s or 0.0
        if decision.replan_s is not None:
            out.replan_s.append(decision.replan_s)
            out.replan_cpu_s.append(decision.replan_cpu_s or 0.0)
        serving = (
            _serving(cluster, _live(spans, ready, before, now), model.num_layers) if decision.spans else set()
        )
        present_devices = set(cluster.ids)
        for peer, span in decision.spans.items():
            old = spans.get(peer)
            if old == span or not set(span.device_ids) <= present_devices:
                continue  # unchanged, or its machine has left
            was = _live(spans, ready, before, now, peer)
            restart = old is None or peer in decision.full_reload
            keep = not restart and was is not None and both_fit(cluster, model, workload, was, span)
            held = None if restart or keep else Assignment(old.device_ids, old.start, old.end)
            after = Assignment(span.device_ids, span.start, span.end)
            # the layout at t = 0 was loaded before the run: the swarm starts serving
            load = load_seconds(model, held, after, sampling.load_bandwidth) if now > 0 else 0.0
            ready[peer] = now + delay + load
            loaded_gb = load * sampling.load_bandwidth / 1e9
            out.loaded_gb += loaded_gb
            out.moved_gb += loaded_gb if old is not None else 0.0
            spans[peer] = span
            if keep:
                before[peer] = was
            else:
                before.pop(peer, None)
            out.moves += old is not None
            out.moves_serving += old is not None and old.device_ids[0] in serving
            out.loads += old is None
        if now in samples:
            live = _live(spans, ready, before, now)
            row, gpus = _score(cluster, live, model, workload, trace, now, sampling.window_s)
            out.samples.append(row)
            out.serving_gpus.append(gpus)
    return out


def _live(spans, ready, before, now: float, machine: str | None = None):
    """The spans served now: a peer's range once loaded, else the range it keeps serving while it
    loads (a make-before-break move), if any. With `machine`: that peer's span or None."""

    def served(m):
        return spans[m] if ready.get(m, 0.0) <= now else before.get(m)

    if machine is not None:
        return served(machine) if machine in spans else None
    return [s for s in map(served, spans) if s is not None]


def _peers_of(spans, devices) -> list[str]:
    """The peers (one per machine, or Petals' one per GPU) that run on these devices."""
    owned = set(devices)
    return [peer for peer, span in spans.items() if span.device_ids[0] in owned]


def _serving(cluster, live, num_layers: int) -> set[str]:
    """The devices of the peers in a complete chain of the spans served now."""
    ids = cluster.ids
    return {ids[d] for chain in decompose(cluster, live, num_layers) for st in chain for d in st.devices}


def _score(cluster, live, model, workload, trace: Trace, now: float, window_s: float):
    """(time, requests met, requests, tokens/s) of the chains of `live` on the trace's window,
    and the number of GPUs in those chains."""
    lo, hi = (int(i) for i in np.searchsorted(trace.arrivals, [now, now + window_s]))
    window = Trace(trace.arrivals[lo:hi] - now, trace.s_in[lo:hi], trace.s_out, trace.deadline_s)
    count = hi - lo
    chains = decompose(cluster, live, model.num_layers)
    if not chains or count == 0:
        return (now, 0, count, 0.0), 0
    dp = PipelineDP(cluster, model, workload)
    costs = [
        stage_costs(cluster, dp.evaluate(stages), model, window.s_in, workload.max_batch) for stages in chains
    ]
    result = simulate_serving(costs, window)
    met = int(round(result.attainment * count))
    gpus = sum(len(s.devices) for stages in chains for s in stages)
    return (now, met, count, result.served * trace.s_out / window_s), gpus
