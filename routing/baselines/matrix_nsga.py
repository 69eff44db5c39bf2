"""NSGA-II with the Explorative Study's own encoding of a chain (§II-B2..B4): the router
benchmark's baseline for routing.chains.nsga, which encodes a chain as one peer per block.

A servers x blocks bit matrix, bit (i, b) = "server i runs block b"; random bits, bit-flip
mutation, single-point crossover, and the coverage constraint "every block has a server"
(number of uncovered blocks <= 0). A block runs on the first set server that serves it; equal
neighbours merge into one hop. Same objectives as routing.chains.nsga, (latency_ms,
-throughput) of the decoded chain, so the two fronts compare by hypervolume.
"""

from __future__ import annotations

from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.problem import Problem
from pymoo.operators.crossover.pntx import SinglePointCrossover
from pymoo.operators.mutation.bitflip import BitflipMutation
from pymoo.operators.sampling.rnd import BinaryRandomSampling

from hexswarm.routing.chains.cost import Candidates, evaluate_assignments, route_from_assignment
from hexswarm.routing.chains.front import Front
from hexswarm.routing.chains.nsga import NsgaConfig, run_nsga


class MatrixProblem(Problem):
    """The study's encoding: x[i * L + b] = 1 when candidate i runs block b (§II-B2)."""

    def __init__(self, cands: Candidates):
        n, num_blocks = cands.size, cands.num_blocks
        super().__init__(n_var=n * num_blocks, n_obj=2, n_ieq_constr=1, xl=0, xu=1, vtype=bool)
        self.cands = cands
        self.serves = cands.serves()  # (n, L)

    def _evaluate(self, x, out, *args, **kwargs):
        bits = x.reshape(len(x), self.cands.size, self.cands.num_blocks).astype(bool) & self.serves
        covered = bits.any(axis=1)  # (pop, L)
        out["F"] = evaluate_assignments(self.cands, bits.argmax(axis=1))
        out["G"] = (~covered).sum(axis=1, keepdims=True).astype(float)  # uncovered blocks <= 0


def _algorithm(cands: Candidates, config: NsgaConfig) -> tuple[Problem, NSGA2]:
    ops = {"sampling": BinaryRandomSampling(), "mutation": BitflipMutation()}
    # Duplicate checks on n * L bits cost more than the whole search; the study had none either.
    return MatrixProblem(cands), NSGA2(
        pop_size=config.pop_size, crossover=SinglePointCrossover(), eliminate_duplicates=False, **ops
    )


def matrix_front(cands: Candidates, config: NsgaConfig) -> Front:
    """The non-dominated chains NSGA-II finds with the bit-matrix encoding, on `config`'s
    population, generations and seed (empty front when it finds no chain that covers the model)."""
    xs = run_nsga(cands, config, _algorithm)
    if xs is None:
        return Front.of([])
    bits = xs.reshape(len(xs), cands.size, cands.num_blocks).astype(bool) & cands.serves()
    return Front.of([route_from_assignment(cands, a) for a in bits.argmax(axis=1)])
