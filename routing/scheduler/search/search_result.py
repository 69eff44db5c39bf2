"""What a placement search returns, raises and reports, whichever search it is.

The genetic search (`genetic.py`), its region-by-region form (`hierarchical.py`) and the search
around pinned stages (`pinned_stages.py`) all answer with a `SearchResult`, and a future
planner beside them (HexGen-2's) can too: these types belong to no one search. `Search` is the
signature of `search.search`, which the region-by-region and pinned searches are handed to
search their parts with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hexswarm.routing.scheduler.plan import Plan
from hexswarm.routing.scheduler.simulation.simulator import SimResult


class NoFeasiblePlanError(ValueError):
    """No group of the cluster's devices can hold one replica of the model."""


@dataclass(frozen=True)
class Progress:
    """Reported after every generation."""

    generation: int
    evaluations: int
    best_attainment: float
    best_mean_latency_s: float
    elapsed_s: float


@dataclass(frozen=True)
class SearchResult:
    """The best plan found, with how the search went."""

    plan: Plan
    result: SimResult
    generations: int
    evaluations: int
    elapsed_s: float
    history: tuple[float, ...]  # best attainment after each generation
    # (fitness, simulation) of the finalists; fitness is (attainment or requests/s, -mean latency)
    finalists: tuple[tuple[tuple[float, float], SimResult], ...] = ()
    cpu_s: float = 0.0  # CPU time of this process during the search (elapsed_s is wall-clock)


# search(cluster, model, workload, config, previous=None, progress=None, layout_cache=None, pinned=())
Search = Callable[..., SearchResult]
