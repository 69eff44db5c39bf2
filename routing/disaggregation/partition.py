"""Step (i) of HexGen-2 §3.2: the initial partition into memory-balanced groups.

1. K, the number of groups, is the cluster's memory over the memory one replica needs (its
   weights, and the KV cache of `max_batch` sequences of the workload's mean length, so that a
   group serves batches rather than just holding the weights).
2. Spectral partitioning (Alpert & Yao 1995): recursive bisection by the Fiedler vector, the
   eigenvector of the second-smallest eigenvalue of the weighted Laplacian L = D - W (networkx
   builds L, scipy solves it). Nodes are sorted along it and cut where the memory on the first
   side reaches its share (k1 / k of the memory for k1 of the k groups), so groups hold equal
   memory and strongly linked nodes stay together.
3. The bisections cut at whole nodes, and their errors add up down the recursion (a 9-way cut
   of setting 3 left groups of 96 and 192 GiB): single-node moves and swaps from the heaviest
   or to the lightest group, each the one that narrows the spread most at the least cut, bring
   the groups within `BALANCE_TOLERANCE` of each other where whole nodes allow
   (Fiduccia–Mattheyses moves, with memory as the goal).
4. Kernighan–Lin (1970) refines every pair of groups: networkx's bisection swaps node pairs
   between the two to lower the bandwidth cut between them (which is the whole change in the
   partition's cut: edges to third groups are cut either way), and a pass is kept only if it
   lowers the cut without leaving the pair's memory more than `BALANCE_TOLERANCE` apart (or
   further apart than it was).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import networkx as nx
import numpy as np
import scipy.linalg
from networkx.algorithms.community import kernighan_lin_bisection

from hexswarm.routing.disaggregation.graph import DeviceGraph, Partition, canonical
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload

BALANCE_TOLERANCE = 0.25  # most |m_a - m_b| / mean(m_a, m_b) a KL pass may leave two groups at
KL_ROUNDS = 3  # passes over all pairs of groups (each stops early once no pair improves)


def replica_bytes(model: ModelSpec, workload: Workload) -> float:
    """Memory one replica needs: weights plus the KV cache of a full batch (HexGen Eq. 7)."""
    tokens = workload.s_in + workload.s_out
    kv = 2.0 * model.kv_width * model.dtype_bytes * model.num_layers * tokens * workload.max_batch
    return model.weight_bytes + kv


def num_groups(graph: DeviceGraph, model: ModelSpec, workload: Workload) -> int:
    """K of §3.2 step (i): total memory / one replica's, at least 2 (a prefill and a decode group)
    and at most the number of nodes."""
    k = int(graph.memory.sum() // replica_bytes(model, workload))
    return max(2, min(k, len(graph)))


def initial_partition(graph: DeviceGraph, k: int) -> Partition:
    """Spectral K-way partition refined by Kernighan–Lin (module docstring)."""
    if not 1 <= k <= len(graph):
        raise ValueError(f"cannot cut {len(graph)} nodes into {k} groups")
    return kl_refine(graph, rebalance(graph, spectral_partition(graph, k)))


def spectral_partition(graph: DeviceGraph, k: int) -> Partition:
    """Recursive spectral bisection into `k` groups of (about) equal memory."""
    return canonical(_split(graph, list(range(len(graph))), k))


def _split(graph: DeviceGraph, nodes: list[int], k: int) -> list[list[int]]:
    if k == 1:
        return [nodes]
    k1 = k // 2
    order = fiedler_order(graph, nodes)
    cut = _balanced_cut(graph, order, k1, k)
    return _split(graph, order[:cut], k1) + _split(graph, order[cut:], k - k1)


def fiedler_order(graph: DeviceGraph, nodes: Sequence[int]) -> list[int]:
    """`nodes` sorted by their entry of the Fiedler vector of their induced subgraph (ties by
    index; the vector's sign is fixed so that its first nonzero entry is negative)."""
    if len(nodes) < 3:
        return sorted(nodes)
    laplacian = nx.laplacian_matrix(graph.graph.subgraph(nodes), nodelist=list(nodes), weight="weight")
    _, vectors = scipy.linalg.eigh(laplacian.toarray())
    fiedler = np.round(vectors[:, 1], 9)
    nonzero = np.flatnonzero(fiedler)
    if len(nonzero) and fiedler[nonzero[0]] > 0:
        fiedler = -fiedler
    return [nodes[i] for i in sorted(range(len(nodes)), key=lambda i: (fiedler[i], nodes[i]))]


def _balanced_cut(graph: DeviceGraph, order: list[int], k1: int, k: int) -> int:
    """Where to cut `order` so that the first side holds k1 / k of the memory; each side keeps at
    least as many nodes as groups it will be cut into. Equal balance: the smaller bandwidth cut."""
    memory = graph.memory[order]
    target = memory.sum() * k1 / k
    cumulative = np.cumsum(memory)
    best, best_key = k1, None
    for cut in range(k1, len(order) - (k - k1) + 1):
        off = abs(cumulative[cut - 1] - target) / memory.sum()
        crossing = graph.bandwidth[np.ix_(order[:cut], order[cut:])].sum()
        key = (round(off, 6), crossing)
        if best_key is None or key < best_key:
            best, best_key = cut, key
    return best


def rebalance(graph: DeviceGraph, groups: Partition) -> Partition:
    """Single-node moves and swaps that narrow the memory spread, while it is above
    `BALANCE_TOLERANCE` (module docstring, step 3): each round tries every move and swap between
    the heaviest or the lightest group and any other, and keeps the one that narrows the spread
    most, at the least bandwidth cut between the two groups."""
    current = [list(g) for g in groups]
    for _ in range(len(graph)):
        memory = np.array([graph.memory[g].sum() for g in current])
        spread = memory.max() - memory.min()
        if spread <= BALANCE_TOLERANCE * memory.mean():
            break
        best, best_key = None, None
        for a in {int(np.argmax(memory)), int(np.argmin(memory))}:
            for b in range(len(current)):
                if b == a:
                    continue
                for option in _balancing_options(current[a], current[b]):
                    after = _exchange(current[a], current[b], option)
                    trial = memory.copy()
                    trial[a], trial[b] = graph.memory[after[0]].sum(), graph.memory[after[1]].sum()
                    narrowed = trial.max() - trial.min()
                    if narrowed >= spread * (1 - 1e-9):
                        continue
                    key = (round(narrowed / memory.mean(), 6), graph.bandwidth[np.ix_(*after)].sum())
                    if best_key is None or key < best_key:
                        best, best_key = (a, b, after), key
        if best is None:
            break
        a, b, (current[a], current[b]) = best
    return canonical(current)


def _balancing_options(a: list[int], b: list[int]):
    """(nodes leaving a, nodes leaving b): moves of one node either way, and swaps; no group is
    left empty."""
    for u in a:
        if len(a) > 1:
            yield (u,), ()
        for v in b:
            yield (u,), (v,)
    if len(b) > 1:
        for v in b:
            yield (), (v,)


def _exchange(a: list[int], b: list[int], option) -> tuple[list[int], list[int]]:
    out, back = option
    return sorted([u for u in a if u not in out] + list(back)), sorted(
        [v for v in b if v not in back] + list(out)
    )


def kl_refine(graph: DeviceGraph, groups: Partition) -> Partition:
    """Kernighan–Lin over every pair of groups, kept where it lowers the cut within the balance
    tolerance (module docstring). Never raises the cut."""
    current = [list(g) for g in groups]
    for _ in range(KL_ROUNDS):
        improved = False
        for a, b in itertools.combinations(range(len(current)), 2):
            pair = _kl_pair(graph, current[a], current[b])
            if pair is not None:
                current[a], current[b] = pair
                improved = True
        if not improved:
            break
    return canonical(current)


def _kl_pair(graph: DeviceGraph, a: list[int], b: list[int]) -> tuple[list[int], list[int]] | None:
    """Group pair (a, b) after one KL bisection of their nodes, or None if it does not help."""
    if len(a) + len(b) < 2:
        return None
    sub = graph.graph.subgraph(a + b)
    new_a, new_b = kernighan_lin_bisection(sub, partition=(set(a), set(b)), weight="weight")
    new_a, new_b = sorted(new_a), sorted(new_b)
    if not new_a or not new_b:
        return None
    old_cut = graph.bandwidth[np.ix_(a, b)].sum()
    new_cut = graph.bandwidth[np.ix_(new_a, new_b)].sum()
    old_spread, new_spread = _pair_spread(graph, a, b), _pair_spread(graph, new_a, new_b)
    if new_cut < old_cut * (1 - 1e-9) and new_spread <= max(old_spread, BALANCE_TOLERANCE):
        return new_a, new_b
    return None


def _pair_spread(graph: DeviceGraph, a: Sequence[int], b: Sequence[int]) -> float:
    ma, mb = graph.memory[list(a)].sum(), graph.memory[list(b)].sum()
    return float(abs(ma - mb) / ((ma + mb) / 2))
