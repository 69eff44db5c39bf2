"""Load-aware chain costs for the trade-off mode: what a request will wait, not just the idle step.

Why: routing.chains.cost scores a hop by its idle decode step, which is what Petals minimises
(Explorative Study, §II-A), and every client that uses it piles onto the same fastest peers. Under
load a chain's time is set by three things that estimate ignores:

1. the prefill: `prompt` tokens through each block, compute bound (prompt / throughput per
   block when that exceeds the weights read), paid once per request;
2. queueing: a peer already busy with `open_sessions` others serves a new step later;
3. hops: each one costs a round trip on every one of the request's (new + 1) steps, and on
   a busy peer also the wait for the iteration in progress plus an iteration that reads the
   weights of every block the batch runs (about its whole range), not just the hop's.

So the trade-off mode scores a hop by the request's mean time per step,

    overhead_i = rtt_i + (transfer(prompt) + new * transfer(1)) / (new + 1)
    per_block_i = (new * d_i + max(d_i, prompt * batch / thr_i)) / (new + 1) * inflation_i

plus, in overhead_i, 1.5 * busy_i * iter_i for a peer found busy with chance busy_i =
min(1, open_i * d_i * span_i / step) (half an iteration of waiting, and the hop's own
iteration reading the whole range rather than its blocks), and an M/M/1-style
inflation_i = 1 / (1 - rho_i) for the peer's utilisation rho_i (clipped at RHO_MAX).

Batching (peers batch decode steps): peers announce a decode rate with `decode_batch_size` sessions stepping
together, dec_i tokens/s per block (swarm_view.PeerView; a peer that does not batch has
dec_i = 1000 / d_i). A step of k sessions costs max(d_i, 1000 k / dec_i) ms per block: one
read of the weights, or the batched rate. So the iteration in progress is
iter_i = span_i * max(d_i, 1000 min(open_i, batch_i) / dec_i) (one session's step on a
peer that does not batch, the whole batch's on one that does), and rho_i comes from the
announced open sessions, assuming they are like this request: each runs about the peer's
whole range, its prompt at the prefill rate and its new tokens at the decode rate, over a
session lasting (new + 1) steps S of the exact min-latency chain,

    rho_i = open_i * batch * (prompt / thr_i + new / dec_i) * span_i / session_s,
    session_s = (new + 1) * S.

S is the chain's step under the very load these costs price (`session_step_ms`: the fixed
point S = step of the idle chain at the costs of S, found by bisection). Taking S as the idle
step instead, as the first version did, counts the open sessions as if they ran unslowed, so
it overstates every busy peer's utilisation, most of all on peers that step their sessions
one at a time.

So k sessions on a batching peer cost about one batched step each round, not k steps,
while on a peer that does not batch they cost k steps (rho_i grows k times faster).

Both stay linear in a hop's blocks, so every solver in routing/ (the exact DP, NSGA-II,
the sweep) runs on them unchanged: they are just other `Candidates` arrays.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hexswarm.routing.chains.cost import Candidates, candidates, make_route, transfer_ms
from hexswarm.routing.chains.min_latency import shortest_chain
from hexswarm.routing.chains.swarm_view import RouteRequest, SwarmView

# Utilisation is clipped here (inflation <= 20x): a snapshot's load is an estimate, and a
# finite cost keeps a busy peer usable when it is the only one serving some blocks.
RHO_MAX = 0.95
SESSION_BISECTIONS = 30  # halvings of the session step's bracket at most (it stops at 0.01% of the idle step)
WAIT_FACTOR = 1.5  # half an iteration of waiting + one whole-range iteration, in units of d_i * span_i


def utilisation(cands: Candidates, request: RouteRequest, session_s: float) -> np.ndarray:
    """(n,) estimated share of each candidate's compute its open sessions take (see module docstring).

    Prompt tokens cost 1 / throughput (batched prefill), generated ones 1 / the peer's decode
    rate when saturated (PeerView.decode_tokens_per_s: batched, or one session at a time).
    """
    open_sessions = np.array([p.open_sessions for p in cands.peers], dtype=float)
    prefill = np.array([p.throughput for p in cands.peers], dtype=float)
    decode = np.array([p.decode_tokens_per_s() for p in cands.peers], dtype=float)
    span = (cands.end - cands.start).astype(float)
    seconds = request.batch_size * (request.prompt_tokens / prefill + request.new_tokens / decode)
    return open_sessions * seconds * span / max(session_s, 1e-3)


def load_aware_candidates(
    view: SwarmView,
    request: RouteRequest,
    exclude: frozenset[str] = frozenset(),
    step_ms: float | None = None,
    need: int | None = None,
) -> Candidates:
    """`candidates(...)` with per-hop and per-block costs replaced by the load-aware ones above.

    step_ms: the step the open sessions are assumed to take (None: solve for it here,
    `session_step_ms`; a caller scoring many loads on one snapshot passes it once). need: as in
    routing.chains.cost.candidates.
    """
    cands = candidates(view, request, exclude, need)
    if cands.size == 0:
        return cands
    if step_ms is None:  # the open sessions run on the whole swarm, not only the peers left here
        whole = cands if not exclude and need is None else candidates(view, request)
        step_ms = _session_step_ms(view, request, whole)
    return _loaded(cands, view, request, step_ms)


def _loaded(cands: Candidates, view: SwarmView, request: RouteRequest, step_ms: float) -> Candidates:
    steps = request.new_tokens + 1
    transfer = (
        transfer_ms(view, request, request.prompt_tokens) + request.new_tokens * transfer_ms(view, request)
    ) / steps
    rtt = cands.overhead_ms - transfer_ms(view, request)
    throughput = np.array([p.throughput for p in cands.peers], dtype=float)
    prefill_ms = np.maximum(cands.decode_ms, 1e3 * request.batch_size * request.prompt_tokens / throughput)
    per_block = (request.new_tokens * cands.decode_ms + prefill_ms) / steps
    rho = np.minimum(utilisation(cands, request, steps * step_ms / 1e3), RHO_MAX)
    wait = WAIT_FACTOR * busy_share(cands, step_ms) * iteration_ms(cands)
    return replace(cands, overhead_ms=rtt + transfer + wait, decode_ms=per_block / (1 - rho))


def idle_step_ms(view: SwarmView, request: RouteRequest) -> float:
    """ms per step of the exact min-latency chain on idle costs."""
    return _idle_step_ms(candidates(view, request))


def session_step_ms(view: SwarmView, request: RouteRequest) -> float:
    """ms per step that the open sessions take, as the load-aware costs see them: the step S of
    the idle min-latency chain priced at the load the open sessions make when each lasts
    (new + 1) steps of S. The price falls as S grows (the same sessions over a longer time are
    a lighter load), so the fixed point is unique; it lies between the idle step and the price
    at the idle step, and bisection finds it. Taking the idle step instead (the earlier rule)
    overstates the utilisation of a peer that steps its sessions one at a time: its sessions
    last several idle steps (docs/benchmarks.md "Router", peers that do not batch)."""
    return _session_step_ms(view, request, candidates(view, request))


def _session_step_ms(view: SwarmView, request: RouteRequest, cands: Candidates) -> float:
    idle = shortest_chain(cands)
    if idle is None:
        return float(cands.overhead_ms.sum())
    low = make_route(cands, idle).latency_ms
    high = make_route(_loaded(cands, view, request, low), idle).latency_ms
    for _ in range(SESSION_BISECTIONS):
        if high - low <= 1e-4 * low:
            break
        middle = (low + high) / 2
        if make_route(_loaded(cands, view, request, middle), idle).latency_ms > middle:
            low = middle
        else:
            high = middle
    return high


def _idle_step_ms(cands: Candidates) -> float:
    idle = shortest_chain(cands)  # the session length the open sessions are assumed to have
    return make_route(cands, idle).latency_ms if idle is not None else float(cands.overhead_ms.sum())


def iteration_ms(cands: Candidates) -> np.ndarray:
    """(n,) the iteration a step may find in progress: one over the peer's whole range, carrying
    as many of its open sessions as it batches (one, on a peer that does not batch)."""
    per_block = [p.step_ms_per_block(min(p.open_sessions, p.decode_batch_size)) for p in cands.peers]
    return np.array(per_block, dtype=float) * (cands.end - cands.start)


def busy_share(cands: Candidates, step_ms: float) -> np.ndarray:
    """(n,) chance a step finds the peer mid-iteration: each open session visits once per step."""
    open_sessions = np.array([p.open_sessions for p in cands.peers], dtype=float)
    iteration_ms = cands.decode_ms * (cands.end - cands.start)
    return np.minimum(1.0, open_sessions * iteration_ms / max(step_ms, 1e-3))
