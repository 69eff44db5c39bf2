"""HexGen's genetic search over pipeline groups (§4.3), with warm start for re-planning.

Each generation mutates tournament-chosen parents (merge / split / swap, early rejection of
offspring that cannot hold a replica), lays out every new group with Algorithm 1
(`PipelineDP`, cached per bucket vector), scores the candidate by its predicted SLO
attainment under the workload's serving model (`ga_fitness.py`; ties broken by mean latency),
and keeps the best `population` distinct individuals (elitism: the best never leaves). The
search stops at the generation or time budget, or after `stall_generations` without
improvement. Under pipelined, batched serving the fitness is an analytic estimate, so the
best `finalists` individuals are then run through the event simulation, and the best of them
by simulation is polished by hill climbing on the simulation (`sim_polish.py`) within what is
left of the time budget.

Warm start: a previous Plan's pipelines become the first individual (devices that left are
dropped, devices that joined form their own K-means groups), so re-planning after a join or
leave starts from a good plan instead of from scratch.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import weight_memory
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP
from hexswarm.routing.scheduler.plan import Plan
from hexswarm.routing.scheduler.plan_eval import make_plan
from hexswarm.routing.scheduler.search.ga_fitness import Evaluator
from hexswarm.routing.scheduler.search.ga_operators import Individual, Mutator, canonical, kmeans_init
from hexswarm.routing.scheduler.search.search_result import NoFeasiblePlanError, Progress, SearchResult
from hexswarm.routing.scheduler.search.sim_polish import best_simulated, polish


@dataclass(frozen=True)
class SearchConfig:
    """Budgets and knobs of the search."""

    population: int = 12
    offspring: int = 12  # children per generation
    max_generations: int = 400
    time_budget_s: float = 20.0
    stall_generations: int = 0  # stop after this many generations without improvement; 0 = never
    seed: int = 0
    mutation: str = "hexgen"  # "hexgen" (merge/split/swap) or "random" (§5.4 ablation)
    # the DP that lays out each group; routing.baselines.symmetric.SymmetricDP gives §5.1's
    # baseline ii (stages share one TP degree and equal layer counts)
    layout_dp: type[PipelineDP] = PipelineDP
    finalists: int = 12  # best individuals re-scored by the event simulation at the end (12: all)
    polish_stall: int = 4  # then hill-climb on the simulation until this many flat rounds (`sim_polish.py`)
    capacity: bool = True  # measure the plan's capacity and bound ratio (`capacity.py`) at the end
    # A swarm: a peer is one process, one TP group on one machine (Device.machine = the peer), so
    # each stage's devices lie on one machine and each machine serves at most one stage.
    one_stage_per_machine: bool = False

    def __post_init__(self) -> None:
        if self.population < 1 or self.offspring < 1 or self.max_generations < 0 or self.time_budget_s < 0:
            raise ValueError("population and offspring must be >= 1, budgets >= 0")
        if self.mutation not in ("hexgen", "random"):
            raise ValueError(f"mutation must be 'hexgen' or 'random', got {self.mutation!r}")


def genetic_search(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    config: SearchConfig = SearchConfig(),
    previous: Plan | None = None,
    progress: Callable[[Progress], None] | None = None,
    layout_cache: dict | None = None,
) -> SearchResult:
    """Runs the genetic search (§4.3) over the whole cluster at once and returns the best plan;
    raises NoFeasiblePlanError. Callers want `search.search`, which runs this on clusters of one
    region or up to `hierarchical.FLAT_LIMIT` devices, and also takes pinned stages.

    `layout_cache`: a dict kept between searches on the same network (first plan, then re-plans
    after devices leave or join) so that a warm re-plan reuses the first search's layouts.
    """
    start, cpu_start = time.perf_counter(), time.process_time()
    rng = random.Random(config.seed)
    whole = config.one_stage_per_machine
    ev = Evaluator(cluster, model, workload, config.layout_dp, layout_cache, whole_machines=whole)
    mutator = Mutator(cluster, model, ev.accept_group, whole_machines=whole)
    replica = _replica_bytes(cluster, model)
    if sum(d.memory_bytes for d in cluster.devices) < replica:
        raise NoFeasiblePlanError(
            f"the cluster's {len(cluster)} devices hold {_gib(cluster)} GiB in all, "
            f"less than the {replica / 2**30:.1f} GiB of {model.name}'s layers"
        )
    seeds = list(dict.fromkeys(mutator.repair(s) for s in _initial(cluster, config, previous)))
    population = _grow(seeds, mutator, ev, rng, config)
    history: list[float] = []
    best, stall, generation = population[0], 0, 0
    loop_s = config.time_budget_s - _finalists_s(population[0], ev, config)
    while generation < config.max_generations and time.perf_counter() - start < loop_s:
        generation += 1
        children = [_offspring(population, mutator, ev, rng, config) for _ in range(config.offspring)]
        population = _select(population + [c for c in children if c is not None], ev, config.population)
        stall = stall + 1 if ev.fitness(population[0]) <= ev.fitness(best) else 0
        best = population[0]
        history.append(ev.fitness(best)[0])
        if progress is not None:
            att, neg_lat = ev.fitness(best)
            progress(Progress(generation, ev.evaluations, att, -neg_lat, time.perf_counter() - start))
        if config.stall_generations and stall >= config.stall_generations:
            break
    finalists = population[: max(1, config.finalists)]
    if previous is not None and seeds[0] not in finalists:
        finalists.append(seeds[0])  # a re-plan never returns worse, simulated, than the old plan repaired
    best = best_simulated(finalists, ev)
    if config.polish_stall and not ev.sequential:
        mutate = lambda ind, r: _mutate(ind, mutator, r, config)  # noqa: E731
        best = polish(best, ev, mutate, rng, config.polish_stall, start + config.time_budget_s)
    layouts = ev.layouts(best)
    if not layouts:
        raise NoFeasiblePlanError(
            f"no group of devices can hold a replica of {model.name} "
            f"({replica / 2**30:.1f} GiB of layers, KV cache for {workload.s_in_max + workload.s_out} tokens)"
        )
    result = ev.simulate(best)
    plan = make_plan(cluster, model, workload, layouts, result, ev.trace.deadline_s, config.capacity)
    scored = tuple((ev.fitness(ind), ev.simulate(ind)) for ind in finalists)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return SearchResult(plan, result, generation, ev.evaluations, elapsed, tuple(history), scored, cpu)


def _finalists_s(first: Individual, ev: Evaluator, config: SearchConfig) -> float:
    """Seconds to keep for simulating the finalists (one simulation, timed, x their number), so
    that the whole search, finalists included, keeps to the time budget even on a loaded machine."""
    if ev.sequential:
        return 0.0
    started = time.perf_counter()
    ev.simulate(first)  # cached: the estimate's best is a finalist
    return (time.perf_counter() - started) * config.finalists


def _replica_bytes(cluster: Cluster, model: ModelSpec) -> float:
    """Bytes of one copy of the model's layers in the devices' weight formats (each format's share
    in proportion to the memory of the devices that use it); `model.weight_bytes` if all are "none"."""
    memory = [d.memory_bytes for d in cluster.devices]
    held = [weight_memory(d, model) for d in cluster.devices]
    if held == memory:
        return model.weight_bytes
    return model.weight_bytes * sum(memory) / max(sum(held), 1e-9)


def _gib(cluster: Cluster) -> str:
    return f"{sum(d.memory_bytes for d in cluster.devices) / 2**30:.1f}"


def _initial(cluster: Cluster, config: SearchConfig, previous: Plan | None) -> list[Individual]:
    """K-means groups at the elbow K (§4.3) and at every larger K: the elbow groups follow the
    network, the finer ones give the search replica-sized groups to start from."""
    elbow, partitions = kmeans_init(cluster, range(len(cluster)), config.seed)
    seeds = [partitions[k] for k in sorted(partitions) if k >= elbow]
    if previous is not None:  # re-planning: start from the old plan, keep the elbow groups as a fallback
        seeds = [warm_individual(cluster, previous, config.seed), partitions[elbow]]
    return seeds


def warm_individual(cluster: Cluster, previous: Plan, seed: int = 0) -> Individual:
    """The previous plan's pipelines on today's devices; new or idle devices grouped by K-means."""
    index = {d.id: i for i, d in enumerate(cluster.devices)}
    groups = [[index[d] for d in p.device_ids if d in index] for p in previous.pipelines]
    placed = {d for g in groups for d in g}
    rest = [i for i in range(len(cluster)) if i not in placed]
    if rest:
        elbow, partitions = kmeans_init(cluster, rest, seed)
        groups += [list(g) for g in partitions[elbow]]
    return canonical(groups)


def _grow(
    seeds: list[Individual], mutator: Mutator, ev: Evaluator, rng: random.Random, config: SearchConfig
) -> list[Individual]:
    """Fills the first population with mutants of the seeds, then ranks it."""
    pool = list(dict.fromkeys(seeds))
    tries = 0
    while len(pool) < config.population and tries < 20 * config.population:
        tries += 1
        child = _mutate(rng.choice(pool[: len(seeds)]), mutator, rng, config)
        if child is not None and child not in pool:
            pool.append(child)
    return _select(pool, ev, config.population)


def _mutate(
    parent: Individual, mutator: Mutator, rng: random.Random, config: SearchConfig
) -> Individual | None:
    if config.mutation == "random":
        return mutator.random_move(parent, rng)
    return mutator.mutate(parent, rng)


def _offspring(
    population: list[Individual], mutator: Mutator, ev: Evaluator, rng: random.Random, config: SearchConfig
) -> Individual | None:
    """Binary tournament, then one mutation (a few tries if offspring are rejected early)."""
    a, b = rng.choice(population), rng.choice(population)
    parent = a if ev.fitness(a) >= ev.fitness(b) else b
    for _ in range(4):
        child = _mutate(parent, mutator, rng, config)
        if child is not None:
            return child
    return None


def _select(candidates: list[Individual], ev: Evaluator, size: int) -> list[Individual]:
    """Elitist truncation: the best `size` distinct candidates (distinct by bucket vectors)."""
    ranked, seen = [], set()
    for ind in sorted(dict.fromkeys(candidates), key=ev.fitness, reverse=True):
        key = ev.key(ind)
        if key not in seen:
            seen.add(key)
            ranked.append(ind)
    return ranked[:size]
