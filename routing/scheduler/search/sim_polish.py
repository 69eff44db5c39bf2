"""The end of the genetic search: pick and polish the plan by event simulation, not by estimate.

HexGen scores every candidate with the simulator (§4.3). Under pipelined, batched serving our
search ranks candidates by an analytic estimate (`fitness.py`) that is off by ~0.1 in
attainment and misranks close plans, so the final word belongs to the event simulation
(`serving.py`):

1. `finalists`: the best individuals by estimate (and, in a re-plan, the old plan repaired) are
   simulated and the best by simulation is kept.
2. `polish`: hill climbing from it, with the simulation as the judge. Each round mutates the
   current plan (`ga_operators.py`'s merge / split / swap), simulates the `PER_ROUND` children
   the estimate likes best, and moves to a child that simulates better. It stops after
   `stall` rounds without a move, or at the deadline.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from hexswarm.routing.scheduler.search.ga_fitness import Evaluator
from hexswarm.routing.scheduler.search.ga_operators import Individual
from hexswarm.routing.scheduler.simulation.simulator import SimResult

CHILDREN = 8  # mutants drawn per round
PER_ROUND = 2  # of which the estimate's best are simulated


def simulated_rank(result: SimResult) -> tuple[float, float, float]:
    """Plans by simulated attainment, then tokens/s, then mean latency."""
    return (result.attainment, result.throughput_tok_s, -result.mean_latency_s)


def best_simulated(candidates: list[Individual], ev: Evaluator) -> Individual:
    """The candidate the event simulation ranks first (ties: the earlier, i.e. the estimate's)."""
    return max(candidates, key=lambda ind: simulated_rank(ev.simulate(ind)))


def polish(
    start: Individual,
    ev: Evaluator,
    mutate: Callable[[Individual, random.Random], Individual | None],
    rng: random.Random,
    stall: int,
    deadline: float,
) -> Individual:
    """Hill climbing on the simulation from `start` (module docstring); `deadline` is a
    `time.perf_counter()` value."""
    best, best_rank = start, simulated_rank(ev.simulate(start))
    flat = 0
    while flat < stall and time.perf_counter() < deadline:
        children = {mutate(best, rng) for _ in range(CHILDREN)} - {None, best}
        ranked = sorted(children, key=lambda ind: (ev.fitness(ind), ev.key(ind)), reverse=True)
        moved = False
        for child in ranked[:PER_ROUND]:
            rank = simulated_rank(ev.simulate(child))
            if rank > best_rank:
                best, best_rank, moved = child, rank, True
        flat = 0 if moved else flat + 1
    return best
