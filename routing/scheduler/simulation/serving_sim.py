"""Event-driven simulation of pipelines serving requests with pipelining and decode batching.

HexGen scores a plan with AlpaServe's simulator (§4.3), in which the stages of a pipeline work
on different requests at the same time. This is that simulator with the decode batching peers
will do (Orca-style iteration batching):

1. Stages are queues. A request's prefill passes every stage in order, then each of its s_out
   decode steps passes every stage in order (the token goes back to stage 0 for the next step;
   Eq. 2 charges no hop for that return, nor do we).
2. An idle stage runs, first, one waiting prefill (prefill is compute bound and is never batched
   with decode, so the two phases keep their own costs), else up to `max_batch` waiting decode
   steps as one step, whose time is `StageCosts.step_s[j][b]`: one weight scan plus b x FLOPs.
3. A request is admitted into its pipeline only while every stage's KV budget (Eq. 7) holds
   its s_in + s_out tokens; it keeps that memory until its last token, and requests wait for
   admission first-come first-served.
4. Hops between stages delay a request (Eq. 6) without occupying either stage.

All pipelines share one event queue so that a request is dispatched, when it arrives, by a
`choose(request, in_flight)` callback that sees how many requests each pipeline holds now
(`serving.py` supplies the AlpaServe-style choice; -1 turns the request away).

As above, a decode step that waits behind a prefill only waits: interference costs latency,
not tokens/s. With an `Interference` model (`interference.py`, measured on a live peer,
HexGen-2 §2), a prefill that a stage starts while its pipeline has sequences decoding takes
(1 + kappa(prompt tokens)) x its time alone, as a peer that interleaves the prompt's chunks
with those sequences' decode batches spends; the genetic search scores plans without it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from hexswarm.routing.scheduler.simulation.interference import Interference
from hexswarm.routing.scheduler.simulation.stage_costs import StageCosts

_ARRIVE, _READY, _DONE = 0, 1, 2  # event kinds; at equal times arrivals go first


Choose = Callable[[int, np.ndarray], int]  # (request, in-flight count per pipeline) -> pipeline or -1


def simulate(
    costs: Sequence[StageCosts],
    arrivals: np.ndarray,
    tokens: np.ndarray,
    s_out: int,
    choose: Choose,
    interference: Interference | None = None,
) -> np.ndarray:
    """(R,) completion time of every request, inf for those turned away.

    arrivals: (R,) increasing arrival times; tokens: (R,) s_in + s_out of each request; request
    r's prefill on stage j of pipeline p takes `costs[p].prefill_s[j, r]`, times
    `interference.inflation(s_in)` while the pipeline has sequences decoding (module docstring).
    """
    events = _Events()
    tokens = np.asarray(tokens, float)
    # (R,) what each request's prefill costs next to decoding sequences, in units of its time alone
    inflation = interference.inflation(tokens - s_out) if interference is not None else np.ones(len(tokens))
    pipes = [_Pipeline(c, p, s_out, tokens, inflation, events) for p, c in enumerate(costs)]
    done = np.full(len(arrivals), np.inf)
    in_flight = np.zeros(len(costs), dtype=int)
    for r, t in enumerate(np.asarray(arrivals, float).tolist()):
        events.push(t, _ARRIVE, (-1, r))
    while events.heap:
        now, kind, _, (p, payload) = heapq.heappop(events.heap)
        if kind == _ARRIVE:
            target = choose(payload, in_flight)
            if target >= 0:
                in_flight[target] += 1
                pipes[target].arrive(payload, now)
        elif kind == _READY:
            pipes[p].ready(payload, now)
        else:
            for r in pipes[p].finish(payload, now):
                done[r] = now
                in_flight[p] -= 1
    return done


def simulate_pipeline(costs: StageCosts, arrivals: np.ndarray, tokens: np.ndarray, s_out: int) -> np.ndarray:
    """One pipeline that takes every request (for tests and hand-checked cases)."""
    return simulate([costs], arrivals, tokens, s_out, lambda r, n: 0)


class _Events:
    """The shared event queue; at equal times arrivals go first, then hand-overs, then step ends."""

    def __init__(self) -> None:
        self.heap: list = []
        self.seq = 0

    def push(self, time: float, kind: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, kind, self.seq, payload))


class _Pipeline:
    """State of one pipeline: per stage a prefill queue, a decode queue and a busy flag."""

    def __init__(
        self,
        costs: StageCosts,
        index: int,
        s_out: int,
        tokens: np.ndarray,
        inflation: np.ndarray,
        events: _Events,
    ):
        self.costs, self.index, self.s_out, self.tokens, self.events = costs, index, s_out, tokens, events
        self.inflation = inflation  # (R,) a prefill's cost next to decoding sequences / alone
        self.decoding = 0  # requests past their prefill, not yet done
        n = costs.num_stages
        self.prefill_q: list[deque] = [deque() for _ in range(n)]
        self.decode_q: list[deque] = [deque() for _ in range(n)]
        self.busy = [False] * n
        self.kv_free = costs.kv_budget.astype(float).copy()
        self.waiting: deque = deque()  # requests not yet admitted (KV full)
        self.steps_left: dict[int, int] = {}

    def arrive(self, r: int, now: float) -> None:
        self.steps_left[r] = self.s_out
        self.waiting.append(r)
        self.admit(now)

    def ready(self, payload, now: float) -> None:
        stage, items, prefill = payload
        (self.prefill_q if prefill else self.decode_q)[stage].extend(items)
        self.start(stage, now)

    def push(self, time: float, kind: int, payload) -> None:
        self.events.push(time, kind, (self.index, payload))

    def admit(self, now: float) -> None:
        """Admits waiting requests, in order, while every stage's KV budget holds them (Eq. 7)."""
        while self.waiting:
            i = self.waiting[0]
            need = self.costs.kv_per_token * self.tokens[i]
            if np.any(need > self.kv_free + 1e-6):
                return
            self.kv_free -= need
            self.waiting.popleft()
            self.prefill_q[0].append(i)
            self.start(0, now)

    def start(self, stage: int, now: float) -> None:
        """If the stage is idle, runs one prefill, else a batch of up to max_batch decode steps."""
        if self.busy[stage]:
            return
        if self.prefill_q[stage]:
            i = self.prefill_q[stage].popleft()
            items, prefill = [i], True
            duration = self.costs.prefill_s[stage, i] * (self.inflation[i] if self.decoding else 1.0)
        elif self.decode_q[stage]:
            queue = self.decode_q[stage]
            items = [queue.popleft() for _ in range(min(len(queue), self.costs.max_batch))]
            prefill = False
            duration = self.costs.step_s[stage, len(items)]
        else:
            return
        self.busy[stage] = True
        self.push(now + float(duration), _DONE, (stage, items, prefill))

    def finish(self, payload, now: float) -> list[int]:
        """A step ended: its sequences hop to the next stage, or finish a pass at the last one;
        returns the requests that completed."""
        stage, items, prefill = payload
        self.busy[stage] = False
        costs = self.costs
        if stage + 1 < costs.num_stages:
            if prefill:
                hop = costs.hop_prefill_s[stage, items[0]]
            else:
                hop = costs.hop_step_s[stage, len(items)]
            self.push(now + float(hop), _READY, (stage + 1, items, prefill))
            completed = []
        else:
            completed = self.end_pass(items, prefill, now)
        self.start(stage, now)
        return completed

    def end_pass(self, items: list[int], prefill: bool, now: float) -> list[int]:
        """At the last stage: a prefill or a decode step done; the next step goes back to stage 0."""
        again, completed = [], []
        if prefill:
            self.decoding += len(items)  # s_out >= 1: every prompt goes on to decode
        for i in items:
            if not prefill:
                self.steps_left[i] -= 1
            if self.steps_left[i] > 0:
                again.append(i)
            else:
                completed.append(i)
                del self.steps_left[i]
                self.decoding -= 1
                self.kv_free += self.costs.kv_per_token * self.tokens[i]
        if again:
            self.decode_q[0].extend(again)
            self.start(0, now)
        if completed:
            self.admit(now)
        return completed
