"""HexGen's Algorithm 1 (§4.2): the DP over GPU-set vectors that lays out one pipeline.

`Tables` holds, for one group of devices split into buckets (devices of one machine, type and
figures), the per-layer cost of a TP group of t devices of bucket k, how many layers it can
hold (Eq. 7), and the hop cost between buckets (Eq. 6). `dp` runs the recursion of
`pipeline_dp.py`'s docstring over these tables and returns the cheapest path of stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import (
    comp_cost,
    group_max_layers,
    pp_comm_cost,
    tp_comm_cost,
    weight_memory,
)
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload

INF = float("inf")
TP_DEGREES = (1, 2, 4, 8)


class Tables:
    """Per-bucket costs of one layer, memory caps and hop costs for one group (constant time, §4.2)."""

    def __init__(
        self, cluster: Cluster, buckets: list[tuple[int, ...]], model: ModelSpec, workload: Workload
    ):
        s_in, s_out, b = float(workload.s_in), workload.s_out, workload.batch_size
        tokens = workload.s_in_max + workload.s_out
        self.counts = tuple(len(bk) for bk in buckets)
        self.unit: dict[tuple[int, int], float] = {}
        self.cap: dict[tuple[int, int], int] = {}
        for k, bk in enumerate(buckets):
            for t in TP_DEGREES:
                if t <= len(bk):
                    devs = bk[:t]
                    cost = comp_cost(cluster, devs, model, 1, s_in, s_out, b) + tp_comm_cost(
                        cluster, devs, model, 1, s_in, s_out, b
                    )
                    self.unit[k, t] = float(cost.total)
                    self.cap[k, t] = group_max_layers(cluster, devs, model, tokens, b)
        self.hop: dict[tuple[int, int], float] = {}
        for k1, b1 in enumerate(buckets):
            for k2, b2 in enumerate(buckets):
                a, c = (b1[:1], b2[:1]) if k1 != k2 else (b1[:1], b1[1:2])
                if c:
                    self.hop[k1, k2] = float(pp_comm_cost(cluster, a, c, model, s_in, s_out, b).total)
        # What the "proportional" rule splits layers by: memory in layers' terms (a quantized
        # device's memory holds more of them).
        self.memory = tuple(weight_memory(cluster.devices[bk[0]], model) for bk in buckets)


def dp(
    tables: Tables,
    num_layers: int,
    rule: str,
    num_stages: int,
    degrees: Sequence[int],
    whole_buckets: bool = False,
):
    """Algorithm 1 with backtracking; returns (cost, [(bucket, degree, start, end), ...]) or (inf, []).

    `whole_buckets` (a swarm: one peer is one machine is one TP group): a bucket serves at most
    one stage, of degree t, and its other devices stay idle; tau then marks a bucket used or not.
    """
    counts = tables.counts
    total_memory = sum(c * m for c, m in zip(counts, tables.memory, strict=False))
    moves = [
        (k, t, tables.unit[k, t], tables.cap[k, t])
        for k in range(len(counts))
        for t in degrees
        if (k, t) in tables.cap and tables.cap[k, t] > 0
    ]

    @cache
    def boundary(j: int, tau: tuple[int, ...]) -> int:
        if rule == "even":
            return round(j * num_layers / num_stages)
        used = sum(c * m for c, m in zip(tau, tables.memory, strict=False))
        return round(num_layers * used / total_memory)

    # Only the "even" rule's boundaries depend on the stage index; under "proportional" the
    # sub-problem is (tau, last) alone, so j stays 0 and memoised states are shared.
    step = 1 if rule == "even" else 0

    @cache
    def rest(j: int, tau: tuple[int, ...], last: int):
        if rule == "even" and j == num_stages:
            return 0.0, ()
        if rule == "proportional" and tau == counts:
            return 0.0, ()
        best = (INF, ())
        start = boundary(j, tau)
        for k, t, unit, cap in moves:
            if tau[k] + t > counts[k] or (whole_buckets and tau[k]):
                continue
            taken = counts[k] if whole_buckets else tau[k] + t
            nxt = tau[:k] + (taken,) + tau[k + 1 :]
            end = boundary(j + step, nxt)
            layers = end - start
            if layers > cap:
                continue  # Eq. 7 violated: +inf
            if layers == 0:  # a zero-layer share: these devices stay idle
                cost, path = rest(j, nxt, last)
            else:
                hop = tables.hop.get((last, k), INF) if last >= 0 else 0.0
                sub_cost, sub_path = rest(j + step, nxt, k)
                cost = unit * layers + hop + sub_cost
                path = ((k, t, start, end),) + sub_path
            if cost < best[0]:
                best = (cost, path)
        return best

    zero = tuple(0 for _ in counts)
    cost, path = rest(0, zero, -1)
    return cost, list(path)
