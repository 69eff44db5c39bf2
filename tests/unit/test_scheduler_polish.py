"""The simulated end of the search (sim_polish.py), warm re-plans and the search's CPU time."""

from __future__ import annotations

import math
import random

import pytest

from hexswarm.routing.scenarios.hexgen_clusters import scenario
from hexswarm.routing.scheduler.model_spec import Workload, preset
from hexswarm.routing.scheduler.search.ga_fitness import Evaluator
from hexswarm.routing.scheduler.search.ga_operators import Mutator
from hexswarm.routing.scheduler.search.genetic import SearchConfig, warm_individual
from hexswarm.routing.scheduler.search.search import search
from hexswarm.routing.scheduler.search.sim_polish import best_simulated, polish, simulated_rank

# Every search here stops after a set number of generations (or a stall), never on the clock: a
# wall-clock budget would make the plan, and so these assertions, depend on the machine's load.
MODEL = preset("Llama-2-70B")
WORKLOAD = Workload(rate=8.0, s_out=32, num_requests=150)


@pytest.fixture(scope="module")
def half_price():
    return scenario("heterogeneous-half-price")


@pytest.fixture(scope="module")
def first(half_price):
    return search(
        half_price, MODEL, WORKLOAD, SearchConfig(max_generations=6, time_budget_s=math.inf, seed=2)
    )


def test_polish_never_returns_a_plan_that_simulates_worse(half_price, first):
    ev = Evaluator(half_price, MODEL, WORKLOAD)
    mutator = Mutator(half_price, MODEL, ev.accept_group)
    start = warm_individual(half_price, first.plan)
    rng = random.Random(0)
    polished = polish(start, ev, mutator.mutate, rng, stall=3, deadline=math.inf)
    assert simulated_rank(ev.simulate(polished)) >= simulated_rank(ev.simulate(start))
    assert best_simulated([start, polished], ev) in (start, polished)


def test_polish_stops_at_its_deadline(half_price, first):
    ev = Evaluator(half_price, MODEL, WORKLOAD)
    mutator = Mutator(half_price, MODEL, ev.accept_group)
    start = warm_individual(half_price, first.plan)
    assert polish(start, ev, mutator.mutate, random.Random(0), stall=50, deadline=0.0) == start


def test_a_warm_replan_is_never_worse_than_the_old_plan_repaired(half_price, first):
    smaller = half_price.without(set(first.plan.device_ids[:4]))
    ev = Evaluator(smaller, MODEL, WORKLOAD)
    mutator = Mutator(smaller, MODEL, ev.accept_group)
    repaired = ev.simulate(mutator.repair(warm_individual(smaller, first.plan, seed=2)))
    config = SearchConfig(max_generations=2, time_budget_s=math.inf, seed=2, finalists=1, polish_stall=0)
    again = search(smaller, MODEL, WORKLOAD, config, previous=first.plan)
    assert simulated_rank(again.result) >= simulated_rank(repaired)


def test_search_reports_cpu_time(first):
    assert 0 < first.cpu_s and first.elapsed_s > 0
