"""Step (v), HexGen-2 §3.4: iterative refinement by max-flow-guided swaps, and the random swaps
of §5.3's truncated variant.

A swap changes two groups of the placement: a node *moves* from one group to another (a group
left empty dissolves), two nodes of different kinds are *exchanged*, or a group *flips* its
role, which is a swap on the coarsened graph of step (ii). After each change the two phases run
again (the groups' layouts and the max flow) and the change is kept only if the flow grows, so
no accepted swap lowers it.

Guided (§3.4): the max flow says where the placement is stuck. Its minimum cut holds the
*bottleneck* edges (a replica at capacity, or a saturated KV link), and replicas whose flow
stays below their capacity are *underused*. Swaps are tried between each bottleneck group and
the underused groups, the most underused first: move a node from the underused group into the
bottleneck one, exchange one node of each, or flip the underused group to the bottleneck's
role. The best swap of the first pair that gains is kept, and the flow recomputed. Only when
no such pair gains are the other pairs tried (least used donors first), so the refinement
ends, as §3.4 says, when no swap gains at all; the guidance decides which swaps come first.

Random (the truncated variant): swaps drawn uniformly from every move, exchange and flip of
the placement, kept when they gain; it ends after as many draws without a gain as the
placement has distinct swaps, or at the deadline.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

from hexswarm.routing.disaggregation.placement import Evaluator, Placement, State, make_state
from hexswarm.routing.disaggregation.roles import DECODE, PREFILL
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import bucket_key

GAIN = 1e-6  # relative flow gain a swap must bring


def gains(new: Placement, old: Placement) -> bool:
    return new.value_rps > old.value_rps * (1 + GAIN) + 1e-12


def refine_guided(
    ev: Evaluator, start: Placement, deadline: float, trail: list | None = None
) -> tuple[Placement, int]:
    """Max-flow-guided swaps until none gains or the deadline passes; (placement, swaps kept).
    `trail` gets (time.perf_counter(), flow in req/s) of every placement kept."""
    current, kept = start, 0
    while time.perf_counter() < deadline:
        better = None
        for batch in guided_swaps(ev, current):
            for state in batch:
                candidate = ev.evaluate(state)
                if gains(candidate, better or current):
                    better = candidate
                if time.perf_counter() >= deadline:
                    break
            if better is not None or time.perf_counter() >= deadline:
                break
        if better is None:
            break
        current, kept = better, kept + 1
        if trail is not None:
            trail.append((time.perf_counter(), current.value_rps))
    return current, kept


def refine_random(
    ev: Evaluator, start: Placement, deadline: float, rng: random.Random, trail: list | None = None
) -> tuple[Placement, int]:
    """Random swaps, kept when they gain (module docstring); (placement, swaps kept, and `trail`
    as for `refine_guided`)."""
    current, kept, stall = start, 0, 0
    swaps = all_swaps(ev, current.state)
    while swaps and stall < len(swaps) and time.perf_counter() < deadline:
        candidate = ev.evaluate(rng.choice(swaps))
        if gains(candidate, current):
            current, kept, stall = candidate, kept + 1, 0
            swaps = all_swaps(ev, current.state)
            if trail is not None:
                trail.append((time.perf_counter(), current.value_rps))
        else:
            stall += 1
    return current, kept


def guided_swaps(ev: Evaluator, placement: Placement) -> Iterator[list[State]]:
    """Batches of swaps, one per (bottleneck group, underused group) pair, in the order of the
    module docstring."""
    state = placement.state
    bottleneck = _bottleneck_groups(placement)
    underused = _underused_groups(placement)
    guided = [(u, b) for b in bottleneck for u in underused if u != b]
    for donor, receiver in guided:
        yield list(_pair_swaps(ev, state, donor, receiver))
    # then the other pairs, the least used donors first: "no swap gains" means none at all
    order = underused + [k for k in range(len(state)) if k not in underused]
    for donor in order:
        for receiver in range(len(state)):
            if donor != receiver and (donor, receiver) not in guided:
                yield list(_pair_swaps(ev, state, donor, receiver))


def all_swaps(ev: Evaluator, state: State) -> list[State]:
    """Every distinct swap of the state (moves and exchanges between any two groups, flips)."""
    out = []
    for a in range(len(state)):
        for b in range(len(state)):
            if a != b:
                out += _pair_swaps(ev, state, donor=a, receiver=b, exchanges=a < b, flip=False)
        out.append(_flip(state, a))
    return list(dict.fromkeys(s for s in out if s != state))


def _bottleneck_groups(placement: Placement) -> list[int]:
    groups = set()
    for edge in placement.flow.bottlenecks:
        if edge[0] == "kv":
            groups.add(placement.group_of(PREFILL, edge[1]))
            groups.add(placement.group_of(DECODE, edge[2]))
        else:
            groups.add(placement.group_of(edge[0], edge[1]))
    return sorted(groups)


def _underused_groups(placement: Placement) -> list[int]:
    """Groups whose flow stays below capacity, the least used first (unusable groups: 0 used)."""
    slack = []
    for role, replicas, flows in (
        (PREFILL, placement.prefill, placement.flow.prefill_rps),
        (DECODE, placement.decode, placement.flow.decode_rps),
    ):
        for i, (replica, flow) in enumerate(zip(replicas, flows, strict=True)):
            used = flow / replica.capacity_rps if replica.capacity_rps > 0 else 0.0
            if used < 1 - GAIN:
                slack.append((used, placement.group_of(role, i)))
    return [k for _, k in sorted(slack)]


def _pair_swaps(
    ev: Evaluator, state: State, donor: int, receiver: int, exchanges: bool = True, flip: bool = True
) -> Iterator[State]:
    """Moves of a donor node to the receiver, exchanges of a node of each (different kinds), and
    the donor's flip to the receiver's role."""
    (give, give_role), (take, take_role) = state[donor], state[receiver]
    for u in _kinds(ev, give):
        yield _replace(
            state, {donor: ([x for x in give if x != u], give_role), receiver: ([*take, u], take_role)}
        )
    if exchanges:
        for u in _kinds(ev, give):
            for v in _kinds(ev, take):
                if _kind(ev, u) != _kind(ev, v):
                    yield _replace(
                        state,
                        {
                            donor: ([x for x in give if x != u] + [v], give_role),
                            receiver: ([x for x in take if x != v] + [u], take_role),
                        },
                    )
    if flip and give_role != take_role:
        yield _flip(state, donor)


def _flip(state: State, k: int) -> State:
    group, role = state[k]
    return _replace(state, {k: (list(group), DECODE if role == PREFILL else PREFILL)})


def _replace(state: State, changes: dict[int, tuple[list[int], str]]) -> State:
    groups = [changes.get(k, entry)[0] for k, entry in enumerate(state)]
    roles = [changes.get(k, entry)[1] for k, entry in enumerate(state)]
    return make_state(groups, roles)


def _kind(ev: Evaluator, node: int) -> tuple:
    """Nodes of one kind are interchangeable (same machine, GPU type and figures)."""
    return tuple(bucket_key(ev.graph.cluster, d) for d in ev.graph.units[node])


def _kinds(ev: Evaluator, group: tuple[int, ...]) -> list[int]:
    """One node of each kind in the group (the first)."""
    seen: dict[tuple, int] = {}
    for node in group:
        seen.setdefault(_kind(ev, node), node)
    return list(seen.values())
