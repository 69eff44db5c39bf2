"""Step (ii) of HexGen-2 §3.2: coarsen, secondary partition into prefill and decode, project.

Coarsening (Hendrickson & Leland 1995) merges each group of the initial partition into a super
node; the edge between two super nodes carries the bandwidth of every link between their
members. The secondary partition then cuts the super nodes in two, and unlike step (i) it
*maximizes* the edge weight across the cut: prefill replicas on one side, decode replicas on the
other, with as much bandwidth as possible between the two types for the KV cache (§3.2). With
up to `EXACT_GROUPS` super nodes every two-sided cut is tried (2^(K-1) - 1 of them, in numpy);
beyond that networkx's one-exchange local search for max-cut. Projection is then the identity
on groups: each group keeps its GPUs and takes its side's role.

Which side prefills is not a bandwidth question (the cut is symmetric); the planner tries both
and keeps the one whose max flow is larger.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import numpy as np
from networkx.algorithms.approximation import one_exchange

from hexswarm.routing.disaggregation.graph import DeviceGraph

PREFILL, DECODE = "prefill", "decode"
ROLES = (PREFILL, DECODE)
EXACT_GROUPS = 16


def coarsen(graph: DeviceGraph, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """(K, K) bandwidth between super nodes (sums over member pairs), 0 on the diagonal."""
    k = len(groups)
    weights = np.zeros((k, k))
    for a in range(k):
        for b in range(a + 1, k):
            weights[a, b] = weights[b, a] = graph.bandwidth[np.ix_(list(groups[a]), list(groups[b]))].sum()
    return weights


def max_cut_sides(weights: np.ndarray, seed: int = 0) -> tuple[bool, ...]:
    """One side of the two-sided cut of the super nodes with the most edge weight across it
    (both sides non-empty; super node 0 is always on the False side)."""
    k = len(weights)
    if k < 2:
        raise ValueError("a secondary partition needs at least two groups")
    if k <= EXACT_GROUPS:
        masks = np.arange(1, 2 ** (k - 1))  # node 0 stays on side 0; mask 0 is one-sided
        sides = (masks[:, None] >> np.arange(0, k - 1)[None, :]) & 1  # node j is bit j - 1
        x = np.hstack([np.zeros((len(masks), 1), dtype=int), sides]).astype(float)  # (M, K)
        cut = ((x @ weights) * (1 - x)).sum(axis=1)
        best = int(np.argmax(cut))  # the first of equal cuts: deterministic
        return tuple(bool(v) for v in x[best])
    g = nx.from_numpy_array(weights)
    _, (side_a, _) = one_exchange(g, seed=seed, weight="weight")
    flip = 0 in side_a
    return tuple((node in side_a) != flip for node in range(k))


def secondary_partition(
    graph: DeviceGraph, groups: Sequence[Sequence[int]], seed: int = 0
) -> tuple[str, ...]:
    """Roles of the groups (projection of the cut of the coarsened graph): side False prefills."""
    sides = max_cut_sides(coarsen(graph, groups), seed)
    return tuple(DECODE if side else PREFILL for side in sides)


def flipped(roles: Sequence[str]) -> tuple[str, ...]:
    """The other orientation of the same cut."""
    return tuple(DECODE if r == PREFILL else PREFILL for r in roles)
