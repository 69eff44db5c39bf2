"""Event simulation of a disaggregated plan (HexGen-2): prefill replicas, KV transfers, decode
replicas; and, beside it, a colocated plan on the same trace, so both are measured alike. The
coordinator scores both kinds of plan with it before it keeps one (`choice.py`), and
benchmarks/disaggregation.py measures them with it.

Disaggregated (`simulate_disaggregated`), in the terms of `serving_sim.py` (whose stage costs,
`stage_costs.py`, it reuses):

1. The coordinator sends each arriving request to a prefill replica, in proportion to the
   plan's prefill flows, by smooth weighted round robin (evenly spread, no bursts, §3.3).
2. A prefill replica admits a request while every stage's memory holds its prompt's KV cache
   (Eq. 7), first come first served. Its stages work on different prompts at once, one prompt
   each (prefill is not batched), and hops between stages delay a prompt without occupying a
   stage.
3. After its last stage the prompt's cache waits in the replica's outbox (in its memory) for a
   KV link. A link carries one cache at a time, and can start one when it is idle and its decode
   replica's memory holds the request's whole context (prompt and generated tokens, reserved
   then); of the links that can start, the prompt takes the one the plan's dispatch ratios owe
   most (smooth weighted round robin over the ready links), so the ratios are kept over time
   but no cache waits for one busy link while another is free. The transfer takes
   `KvLink.seconds` of its prompt (`kv_transfer.py`, Table 1); when it ends, the prefill
   replica frees the prompt's cache. (A prompt tied to its link at once, as a fixed ratio
   would have it, queued behind slow links: on setting 1 with OPT-30B the replicas' memory
   filled with such prompts and the simulation served 28% less than the max flow.)
4. A decode replica runs the request's s_out decode steps as a colocated pipeline does
   (batches of up to max_batch waiting sequences per stage), but never waits behind a prefill,
   and decodes at most the plan's `max_sequences` at once (caches received beyond that wait
   in its memory for a slot).

Colocated (`simulate_colocated`): HexGen's plan as `serving.py` simulates it, where each stage
runs a waiting prefill before any decode batch, so a decode step waits behind every prefill on
its stage: the prefill-decode interference that disaggregation removes. Given an
`Interference` model (`routing/scheduler/simulation/interference.py`, measured on a live peer), a prefill
next to decoding sequences also costs its stage more than its time alone, so interference
costs tokens/s as well as latency (HexGen-2 §2).

Both return every request's completion time. `saturating_trace` offers more than any placement
of the cluster serves (`capacity.SATURATION` x its upper bound), so queues only grow while
requests arrive, and `steady_throughput` counts the generated tokens of the requests completed
in a window of that time: from a quarter of the way between the first completion and the last
arrival (the replicas have filled) to the last arrival (the queues are still full). That is the
plan's capacity. Counting instead all tokens over the time to the last completion (as
`simulator.summarize` does) charges the fill and the drain, about one request's latency each,
which a decode replica batching a hundred sequences of 256 tokens makes 30 to 50 s: on a
60-second trace the plans of HexGen-2's settings measured 25 to 30% under their steady rate.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from hexswarm.routing.disaggregation.kv_transfer import KvLink, kv_link
from hexswarm.routing.disaggregation.plan_record import DisaggregatedPlan
from hexswarm.routing.disaggregation.replica import decode_microbatch
from hexswarm.routing.disaggregation.roles import PREFILL
from hexswarm.routing.scheduler.bounds.capacity import SATURATION
from hexswarm.routing.scheduler.bounds.upper_bound import throughput_upper_bound
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP, PipelineLayout, StageLayout
from hexswarm.routing.scheduler.simulation import serving_sim
from hexswarm.routing.scheduler.simulation.interference import Interference
from hexswarm.routing.scheduler.simulation.serving import Dispatcher
from hexswarm.routing.scheduler.simulation.simulator import Trace, make_trace
from hexswarm.routing.scheduler.simulation.stage_costs import StageCosts, stage_costs

_ARRIVE, _STAGE_DONE, _READY, _SENT = 0, 1, 2, 3  # event kinds


def saturating_trace(cluster: Cluster, model: ModelSpec, workload: Workload, seconds: float) -> Trace:
    """Poisson arrivals for `seconds` at SATURATION x the cluster's upper bound, no deadline.
    The bound is the one without the coupling of a device's prefill to its decode
    (`upper_bound.py`), which a disaggregated plan does not have."""
    bound = throughput_upper_bound(cluster, model, workload, workload.max_batch, coupled_prompt_tokens=0.0)
    rate = SATURATION * bound.requests_s
    count = max(100, round(rate * seconds))
    return make_trace(model, replace(workload, rate=rate, num_requests=count, objective="throughput"))


def steady_throughput(trace: Trace, done: np.ndarray) -> float:
    """Generated tokens/s in the saturated window of the run (module docstring)."""
    finished = np.sort(done[np.isfinite(done)])
    end = float(trace.arrivals[-1])
    if not len(finished) or finished[0] >= end:
        return 0.0
    start = finished[0] + 0.25 * (end - finished[0])
    count = np.count_nonzero((finished > start) & (finished <= end))
    return float(count * trace.s_out / (end - start))


def simulate_colocated(
    cluster: Cluster,
    model: ModelSpec,
    layouts: Sequence[PipelineLayout],
    trace: Trace,
    max_batch: int,
    interference: Interference | None = None,
) -> np.ndarray:
    """(R,) completion times of HexGen's colocated pipelines on `trace`: `serving_sim` with
    `serving.py`'s dispatcher, every request admitted, prefills inflated by `interference`
    next to decoding sequences if given (module docstring)."""
    costs = [stage_costs(cluster, layout, model, trace.s_in, max_batch) for layout in layouts]
    unbounded = replace(trace, deadline_s=math.inf)
    tokens = trace.s_in + trace.s_out
    dispatcher = Dispatcher(costs, unbounded)
    return serving_sim.simulate(costs, trace.arrivals, tokens, trace.s_out, dispatcher, interference)


def plan_layouts(cluster: Cluster, model: ModelSpec, workload: Workload, plan: DisaggregatedPlan):
    """Each replica's stages as a layout over `cluster`'s device indices, in plan order."""
    dp = PipelineDP(cluster, model, workload)
    return [
        dp.evaluate(
            [StageLayout(tuple(cluster.index(d) for d in s.device_ids), s.start, s.end) for s in r.stages]
        )
        for r in plan.replicas
    ]


def simulate_disaggregated(
    cluster: Cluster,
    model: ModelSpec,
    plan: DisaggregatedPlan,
    trace: Trace,
    workload: Workload,
    microbatches: bool = True,
) -> np.ndarray:
    """(R,) completion times of the plan serving `trace` (module docstring); every request is
    admitted, and the run stops at the last arrival (later completions are inf), which is all
    `steady_throughput` reads."""
    layouts = plan_layouts(cluster, model, workload, plan)
    sim = _Simulation(trace)
    replicas: dict[int, _Prefill | _Decode] = {}
    for i, (replica, layout) in enumerate(zip(plan.replicas, layouts, strict=True)):
        if replica.role == PREFILL:
            replicas[i] = _Prefill(sim, stage_costs(cluster, layout, model, trace.s_in, 1))
        else:
            costs = stage_costs(cluster, layout, model, trace.s_in, workload.max_batch)
            size = decode_microbatch(replica.max_sequences, costs.num_stages, workload.max_batch)
            replicas[i] = _Decode(sim, costs, replica.max_sequences, size if microbatches else 0)
    dispatch = plan.dispatch()
    for i, row in dispatch.items():
        prefill = replicas[i]
        for j in row:
            link = _Link(sim, prefill, replicas[j], kv_link(cluster, model, layouts[i], layouts[j]))
            prefill.links[j] = link
            replicas[j].incoming.append(link)
        prefill.picker = _RoundRobin(row)
    entry = _RoundRobin({i: share for i, share in plan.prefill_share().items() if share > 0})
    return sim.run(lambda r: replicas[entry.pick()].arrive(r), until=float(trace.arrivals[-1]))


class _Simulation:
    """The event queue and the trace's requests."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.s_in = trace.s_in
        self.heap: list = []
        self.seq = 0
        self.done = np.full(len(trace.arrivals), np.inf)

    def push(self, time: float, kind: int, handler, payload) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, kind, self.seq, handler, payload))

    def run(self, arrive, until: float = math.inf) -> np.ndarray:
        for r, t in enumerate(self.trace.arrivals.tolist()):
            self.push(t, _ARRIVE, None, r)
        while self.heap and self.heap[0][0] <= until:
            self.now, kind, _, handler, payload = heapq.heappop(self.heap)
            if kind == _ARRIVE:
                arrive(payload)
            else:
                handler(payload)
        return self.done


class _RoundRobin:
    """Smooth weighted round robin: each key picked in proportion to its weight, evenly spread."""

    def __init__(self, weights: dict[int, float]):
        self.keys = sorted(weights)
        self.weights = np.array([weights[k] for k in self.keys], dtype=float)
        self.current = np.zeros(len(self.keys))

    def pick(self, ready=None) -> int:
        """The next key; with `ready`, the most owed key for which ready(key) holds, if any."""
        self.current += self.weights
        order = np.argsort(-self.current, kind="stable")
        k = int(order[0])
        if ready is not None:
            k = next((int(i) for i in order if ready(self.keys[int(i)])), k)
        self.current[k] -= self.weights.sum()
        return self.keys[k]


class _Prefill:
    """A prefill replica: stages of one prompt each; a finished prompt keeps its KV cache here,
    in the outbox, until one of the replica's links takes it."""

    def __init__(self, sim: _Simulation, costs: StageCosts):
        self.sim, self.costs = sim, costs
        self.kv_free = costs.kv_budget.astype(float).copy()
        self.waiting: deque = deque()
        self.queues = [deque() for _ in range(costs.num_stages)]
        self.busy = [False] * costs.num_stages
        self.outbox: deque = deque()
        self.links: dict[int, _Link] = {}
        self.picker: _RoundRobin | None = None

    def arrive(self, r: int) -> None:
        self.waiting.append(r)
        self.admit()

    def admit(self) -> None:
        while self.waiting:
            r = self.waiting[0]
            need = self.costs.kv_per_token * self.sim.s_in[r]
            if np.any(need > self.kv_free + 1e-6):
                return
            self.kv_free -= need
            self.waiting.popleft()
            self.queues[0].append(r)
            self.start(0)

    def start(self, j: int) -> None:
        if not self.busy[j] and self.queues[j]:
            r = self.queues[j].popleft()
            self.busy[j] = True
            self.sim.push(
                self.sim.now + float(self.costs.prefill_s[j, r]), _STAGE_DONE, self.stage_done, (j, r)
            )

    def stage_done(self, payload) -> None:
        j, r = payload
        self.busy[j] = False
        if j + 1 < self.costs.num_stages:
            self.sim.push(
                self.sim.now + float(self.costs.hop_prefill_s[j, r]), _READY, self.ready, (j + 1, r)
            )
        else:
            self.outbox.append(r)
            self.send()
        self.start(j)

    def ready(self, payload) -> None:
        j, r = payload
        self.queues[j].append(r)
        self.start(j)

    def send(self) -> None:
        """Hands finished prompts, oldest first, to links that can start now: of those, the one
        the dispatch ratios owe most."""
        while self.outbox:
            r = self.outbox[0]
            ready = {j for j, link in self.links.items() if link.ready(r)}
            if not ready:
                return
            self.outbox.popleft()
            self.links[self.picker.pick(ready.__contains__)].start(r)

    def release(self, r: int) -> None:
        self.kv_free += self.costs.kv_per_token * self.sim.s_in[r]
        self.admit()


class _Link:
    """One KV link: one transfer at a time, started once the decode replica holds the context."""

    def __init__(self, sim: _Simulation, prefill: _Prefill, decode: _Decode, link: KvLink):
        self.sim, self.prefill, self.decode, self.link = sim, prefill, decode, link
        self.busy = False

    def ready(self, r: int) -> bool:
        return not self.busy and self.decode.fits(r)

    def start(self, r: int) -> None:
        self.decode.reserve(r)
        self.busy = True
        self.sim.push(self.sim.now + self.link.seconds(float(self.sim.s_in[r])), _SENT, self.sent, r)

    def sent(self, r: int) -> None:
        self.busy = False
        self.prefill.release(r)
        self.decode.begin(r)
        self.prefill.send()


class _Decode:
    """A decode replica: s_out passes of batched decode steps per request, no prefill, at most
    `limit` sequences decoding at once (0: no limit; caches received beyond it wait, in memory).

    `microbatch` > 0: the decoding sequences rotate through the stages as fixed microbatches of
    up to that many (a sequence joins one when it passes stage 0 again with room), as
    `replica.decode_capacity` counts them. 0: each stage batches whatever waits for it, up to
    max_batch, as `serving_sim.py` does; sequences that return at different times then split
    into short batches that each cost a whole weight scan."""

    def __init__(self, sim: _Simulation, costs: StageCosts, limit: int = 0, microbatch: int = 0):
        self.sim, self.costs, self.limit, self.microbatch = sim, costs, limit, microbatch
        self.held: deque = deque()  # received, waiting for a decoding slot
        self.joining: deque = deque()  # decoding, waiting for a microbatch with room
        self.idle_batches = -(-limit // microbatch) if microbatch else 0
        self.kv_free = costs.kv_budget.astype(float).copy()
        self.queues = [deque() for _ in range(costs.num_stages)]  # of batches (lists)
        self.busy = [False] * costs.num_stages
        self.steps_left: dict[int, int] = {}
        self.incoming: list[_Link] = []
        self.turn = 0  # which incoming link's replica is offered freed memory first (round robin)

    def tokens(self, r: int) -> float:
        return float(self.sim.s_in[r] + self.sim.trace.s_out)

    def fits(self, r: int) -> bool:
        return not np.any(self.costs.kv_per_token * self.tokens(r) > self.kv_free + 1e-6)

    def reserve(self, r: int) -> None:
        self.kv_free -= self.costs.kv_per_token * self.tokens(r)

    def begin(self, r: int) -> None:
        self.held.append(r)
        self.activate()
        self.start(0)

    def activate(self) -> None:
        """Received caches start decoding while there is room; idle microbatches set off."""
        while self.held and (not self.limit or len(self.steps_left) < self.limit):
            r = self.held.popleft()
            self.steps_left[r] = self.sim.trace.s_out
            self.joining.append(r)
        if not self.microbatch:
            if self.joining:
                self.queues[0].append(list(self.joining))
                self.joining.clear()
            return
        while self.idle_batches and self.joining:
            self.idle_batches -= 1
            self.queues[0].append(self.join([]))

    def join(self, members: list[int]) -> list[int]:
        while self.joining and len(members) < self.microbatch:
            members.append(self.joining.popleft())
        return members

    def start(self, j: int) -> None:
        queue = self.queues[j]
        if self.busy[j] or not queue:
            return
        if self.microbatch:
            batch = queue.popleft()
        else:  # whatever waits, up to max_batch
            batch = []
            while queue and len(batch) < self.costs.max_batch:
                room = self.costs.max_batch - len(batch)
                batch += queue[0][:room]
                if len(queue[0]) > room:
                    queue[0] = queue[0][room:]
                else:
                    queue.popleft()
        self.busy[j] = True
        seconds = float(self.costs.step_s[j, len(batch)])
        self.sim.push(self.sim.now + seconds, _STAGE_DONE, self.stage_done, (j, batch))

    def stage_done(self, payload) -> None:
        j, batch = payload
        self.busy[j] = False
        if j + 1 < self.costs.num_stages:
            hop = float(self.costs.hop_step_s[j, len(batch)])
            self.sim.push(self.sim.now + hop, _READY, self.ready, (j + 1, batch))
        else:
            self.end_pass(batch)
        self.start(j)

    def ready(self, payload) -> None:
        j, batch = payload
        self.queues[j].append(batch)
        self.start(j)

    def end_pass(self, batch: list[int]) -> None:
        """A pass ended: finished sequences leave and free their memory, the rest go round again."""
        again = []
        for r in batch:
            self.steps_left[r] -= 1
            if self.steps_left[r] > 0:
                again.append(r)
            else:
                del self.steps_left[r]
                self.sim.done[r] = self.sim.now
                self.kv_free += self.costs.kv_per_token * self.tokens(r)
        finished = len(again) < len(batch)
        self.activate()
        if self.microbatch:
            again = self.join(again)
            if again:
                self.queues[0].append(again)
            else:
                self.idle_batches += 1
            self.activate()
        elif again:
            self.queues[0].append(again)
        self.start(0)
        if finished:
            for k in range(len(self.incoming)):
                self.incoming[(self.turn + k) % len(self.incoming)].prefill.send()
            self.turn += 1
