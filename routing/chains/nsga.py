"""NSGA-II over chains of peers (Explorative Study, §II-B), with our encoding of a chain.

The problem minimises (latency_ms, -throughput) of the decoded chain (routing.chains.cost).
The encoding is one gene per block holding the peer that runs it, valid by construction (so no
constraint and no wasted bits). Mutation reassigns a random contiguous sub-range of one peer's
range to that peer, which makes or splits whole hops; crossover swaps the segment between two
layer boundaries where both parents start a hop (a cut inside a hop would add a hop, a round
trip per token). The initial population is random chains led by the chains of a short
epsilon-constraint sweep (routing.chains.sweep_seeds), the exact min-latency chain first, so
the front always holds the fastest chain.

The Explorative Study's own encoding, a servers x blocks bit matrix, is the router benchmark's
baseline (routing.baselines.matrix_nsga); its fronts live in the same objective space, so the
two compare by hypervolume.

What sets the front's quality is the seeding and the gap filling: at 100 and 500 peers
NSGA-II from random chains reached 0.26-0.48 of the full sweep's hypervolume, from 16
sweep solves 0.94-0.97, and splicing the final front's neighbours (routing.chains.relink)
0.96-0.99; the generations in between add less than 0.01 (docs/routing.md "The front"). So
the default runs few generations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.crossover import Crossover
from pymoo.core.mutation import Mutation
from pymoo.core.problem import Problem
from pymoo.core.sampling import Sampling
from pymoo.optimize import minimize

from hexswarm.routing.chains.cost import (
    Candidates,
    evaluate_assignments,
    missing_blocks,
    route_from_assignment,
)
from hexswarm.routing.chains.front import Front
from hexswarm.routing.chains.min_latency import Hops
from hexswarm.routing.chains.relink import non_dominated, relink
from hexswarm.routing.chains.sweep_seeds import sweep_seeds

_MATING_TRIES = 5


@dataclass(frozen=True)
class NsgaConfig:
    """Search budget of one NSGA-II run."""

    # the seed used 100; the seeds, not the size, set the front (docs/routing.md "The front")
    pop_size: int = 40
    generations: int = 4
    seed: int = 0
    anchors: bool = True  # start from chains of a short epsilon-constraint sweep
    seed_solves: int = 16  # that sweep's budget of floored solves (routing.chains.sweep_seeds)
    relink_rounds: int = 1  # splice neighbours of the final front (routing.chains.relink)

    def __post_init__(self) -> None:
        if self.pop_size < 4 or self.generations < 1:
            raise ValueError(
                f"need pop_size >= 4 and generations >= 1, got {self.pop_size}, {self.generations}"
            )


class ChainProblem(Problem):
    """Our encoding: gene b = candidate index running block b."""

    def __init__(self, cands: Candidates):
        super().__init__(n_var=cands.num_blocks, n_obj=2, xl=0, xu=cands.size - 1, vtype=int)
        self.cands = cands

    def _evaluate(self, x, out, *args, **kwargs):
        out["F"] = evaluate_assignments(self.cands, x.astype(np.int64))


def _random_chain(cands: Candidates, rng: np.random.Generator) -> np.ndarray:
    """A random chain as a per-block assignment: random peer at each boundary, long hops likelier."""
    assign = np.empty(cands.num_blocks, dtype=np.int64)
    b = 0
    while b < cands.num_blocks:
        rows = np.flatnonzero((cands.start <= b) & (b < cands.end))
        i = int(rng.choice(rows))
        end = int(cands.end[i]) if rng.random() < 0.5 else int(rng.integers(b + 1, cands.end[i] + 1))
        assign[b:end] = i
        b = end
    return assign


def _assignment(hops: Hops, num_blocks: int) -> np.ndarray:
    assign = np.empty(num_blocks, dtype=np.int64)
    for i, s, e in hops:
        assign[s:e] = i
    return assign


class ChainSampling(Sampling):
    """Random chains, led by the exact anchors when the config asks for them."""

    def __init__(self, cands: Candidates, anchors: list[Hops], seed: int):
        super().__init__()
        self.cands, self.anchors, self.rng = cands, anchors, np.random.default_rng(seed)

    def _do(self, problem, n_samples, **kwargs):
        rows = [_assignment(h, self.cands.num_blocks) for h in self.anchors[:n_samples]]
        rows += [_random_chain(self.cands, self.rng) for _ in range(n_samples - len(rows))]
        return np.array(rows)


class HopCrossover(Crossover):
    """Two-point crossover at layer boundaries where both parents start a hop.

    Cutting inside a hop splits it in two, and each extra hop costs a round trip per token,
    so a random cut point almost always yields a child far behind both parents. Swapping the
    segment between two shared hop boundaries splices whole hops: the child mixes a faster
    parent's hops with a wider one's, which is what the points between them on the front are.
    """

    def __init__(self, seed: int):
        super().__init__(2, 2)
        self.rng = np.random.default_rng(seed)

    def _do(self, problem, x, **kwargs):
        x = x.astype(np.int64)
        children = x.copy()
        for m in range(x.shape[1]):
            a, b = x[0, m], x[1, m]
            shared = np.flatnonzero((a[1:] != a[:-1]) & (b[1:] != b[:-1])) + 1
            cuts = np.concatenate([[0], shared, [len(a)]])
            lo, hi = np.sort(self.rng.choice(len(cuts), size=2, replace=False))
            s, e = int(cuts[lo]), int(cuts[hi])
            children[0, m, s:e], children[1, m, s:e] = b[s:e], a[s:e]
        return children


class HopMutation(Mutation):
    """Give a random sub-range of one peer's blocks (around a random block) to that peer."""

    def __init__(self, cands: Candidates, seed: int):
        super().__init__()
        self.cands, self.rng = cands, np.random.default_rng(seed)
        self.serving = [np.flatnonzero((cands.start <= b) & (b < cands.end)) for b in range(cands.num_blocks)]

    def _do(self, problem, x, **kwargs):
        x = x.astype(np.int64, copy=True)
        for row in x:
            b = int(self.rng.integers(0, self.cands.num_blocks))
            i = int(self.rng.choice(self.serving[b]))
            lo, hi = int(self.cands.start[i]), int(self.cands.end[i])
            s = lo if self.rng.random() < 0.5 else int(self.rng.integers(lo, b + 1))
            e = hi if self.rng.random() < 0.5 else int(self.rng.integers(b + 1, hi + 1))
            row[s:e] = i
        return x


def _algorithm(cands: Candidates, config: NsgaConfig) -> tuple[Problem, NSGA2]:
    anchors = sweep_seeds(cands, config.seed_solves) if config.anchors else []
    algorithm = NSGA2(
        pop_size=config.pop_size,
        sampling=ChainSampling(cands, anchors, config.seed),
        crossover=HopCrossover(config.seed + 2),
        mutation=HopMutation(cands, config.seed + 1),
        eliminate_duplicates=True,
    )
    # pymoo retries mating up to 100 times to fill a generation with unseen chains; a small
    # swarm has few chains, and those retries made a 10-peer run 10x slower than a 100-peer one.
    algorithm.mating.n_max_iterations = _MATING_TRIES
    return ChainProblem(cands), algorithm


def nsga_front(cands: Candidates, config: NsgaConfig = NsgaConfig()) -> Front:
    """The non-dominated chains NSGA-II finds (empty front when no chain covers the model)."""
    xs = run_nsga(cands, config, _algorithm)
    if xs is None:
        return Front.of([])
    assigns = relink(cands, non_dominated(cands, xs.astype(np.int64)), config.relink_rounds)
    return Front.of([route_from_assignment(cands, a) for a in assigns])


def run_nsga(
    cands: Candidates,
    config: NsgaConfig,
    algorithm: Callable[[Candidates, NsgaConfig], tuple[Problem, NSGA2]],
) -> np.ndarray | None:
    """The final population's genes (one row per chain) of NSGA-II on the problem and algorithm
    that `algorithm` builds, or None when no chain covers the model or none was found."""
    if cands.size == 0 or missing_blocks(cands):
        return None
    problem, nsga2 = algorithm(cands, config)
    result = minimize(problem, nsga2, ("n_gen", config.generations), seed=config.seed, verbose=False)
    if result.X is None:  # no feasible chain (an encoding with a coverage constraint)
        return None
    return np.atleast_2d(result.X)
