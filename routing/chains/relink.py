"""Fill the gaps of a chain front by splicing neighbouring chains (path relinking; pure, no I/O).

Why: a front of k points loses area in every gap between neighbours; with the 12-16
points that NSGA-II keeps from its seeded population (routing.chains.nsga) that loss was
3-6% of the epsilon-constraint sweep's hypervolume at 100 and 500 peers. The chains
between two neighbours A (faster) and B (wider) are mostly A with some of its hops
replaced by B's: B's extra hops where A's bottleneck peer runs too many blocks. So for
each pair of neighbours we build every child that swaps one segment between two layer
boundaries where both chains start a hop (cutting inside a hop would add a hop, a round
trip per token), score all of them at once, and keep the non-dominated ones. This is
NSGA-II's hop crossover (routing.chains.nsga.HopCrossover) made exhaustive along the
front, a memetic local search step after the genetic one (path relinking, Glover's
scatter search; used the same way after NSGA-II by many multi-objective memetic methods).
"""

from __future__ import annotations

import numpy as np

from hexswarm.routing.chains.cost import Candidates, evaluate_assignments

# Children scored per call of evaluate_assignments: bounds its (rows x peers) count matrix.
_CHUNK = 2048


def relink(cands: Candidates, front: np.ndarray, rounds: int = 1) -> np.ndarray:
    """Non-dominated chains among `front` (k, L) and every segment swap of neighbouring chains.

    front: per-block candidate indices of non-dominated chains sorted by latency. Each round
    splices the neighbours of the previous round's front.
    """
    for _ in range(rounds):
        if len(front) < 2:
            return front
        children = [_splices(a, b) for a, b in zip(front, front[1:], strict=False)]
        front = non_dominated(cands, np.concatenate([front, *children]))
    return front


def _splices(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(2m, L): a with b's segment [s, e) and b with a's, for every pair of shared hop boundaries."""
    num_blocks = len(a)
    shared = np.flatnonzero((a[1:] != a[:-1]) & (b[1:] != b[:-1])) + 1
    cuts = np.concatenate([[0], shared, [num_blocks]])
    lo, hi = np.triu_indices(len(cuts), k=1)
    keep = (cuts[lo] > 0) | (cuts[hi] < num_blocks)  # swapping everything just swaps the parents
    s, e = cuts[lo[keep]], cuts[hi[keep]]
    blocks = np.arange(num_blocks)
    inside = (blocks >= s[:, None]) & (blocks < e[:, None])  # (m, L)
    return np.concatenate([np.where(inside, b, a), np.where(inside, a, b)])


def non_dominated(cands: Candidates, chains: np.ndarray) -> np.ndarray:
    """The chains no other beats on both objectives (one per objective pair), sorted by latency."""
    objectives = np.concatenate(
        [evaluate_assignments(cands, chains[k : k + _CHUNK]) for k in range(0, len(chains), _CHUNK)]
    )
    order = np.lexsort((objectives[:, 1], objectives[:, 0]))  # by latency, then most throughput
    kept, best = [], np.inf
    for k in order:
        if objectives[k, 1] < best:  # -throughput: lower is wider
            kept.append(k)
            best = objectives[k, 1]
    return chains[kept]
