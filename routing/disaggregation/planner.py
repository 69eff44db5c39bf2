"""HexGen-2's scheduler (§3): where the live swarm, `hexswarm plan --disaggregated` and the
benchmark start.

One *start* runs the two phases and the refinement once:

1. graph partition (§3.2): the cluster as a graph (`graph.py`), K memory-balanced groups by
   spectral partitioning and Kernighan–Lin (`partition.py`), then the groups coarsened and cut
   again into prefill and decode replicas (`roles.py`), both orientations of the cut evaluated;
2. max flow (§3.3): each group's layout in its role (`replica.py`), the KV links between the
   roles (`kv_transfer.py`), preflow-push over the flow network (`flow.py`, through
   `placement.py`);
3. iterative refinement (§3.4): max-flow-guided swaps until none gains (`refine.py`).

The paper fixes K from memory. Here starts run at K, K - 1, K + 1, K - 2, ... (a replica's
memory need depends on the batch it serves, which K's estimate only guesses) until the time
budget runs out or every K from 2 to the number of nodes is done, and the placement with the
largest flow wins. `swaps="random"` gives §5.3's truncated variant: the same starts, with random
swaps in place of the guided ones. A search that ends on its own (every start converged) is
deterministic for a seed; one cut short by the time budget depends on the machine's speed.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass

from hexswarm.routing.disaggregation.graph import build_graph
from hexswarm.routing.disaggregation.partition import initial_partition, num_groups
from hexswarm.routing.disaggregation.placement import Evaluator, Placement, make_state
from hexswarm.routing.disaggregation.plan_record import DisaggregatedPlan, make_disaggregated_plan
from hexswarm.routing.disaggregation.refine import refine_guided, refine_random
from hexswarm.routing.disaggregation.replica import ReplicaPlanner
from hexswarm.routing.disaggregation.roles import flipped, secondary_partition
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.plan import PlanError
from hexswarm.routing.scheduler.search.search_result import NoFeasiblePlanError

SWAPS = ("max-flow", "random")


@dataclass(frozen=True)
class DisaggregationConfig:
    """Budget and knobs of the search."""

    time_budget_s: float = 20.0
    seed: int = 0
    swaps: str = "max-flow"  # or "random": §5.3's truncated variant
    max_starts: int = 0  # starts (values of K) to run at most; 0: until the budget or the Ks run out
    # A swarm: a peer is one machine serving one TP group, so the graph's nodes are machines and
    # each serves at most one stage (`PipelineDP(whole_buckets=True)`).
    whole_machines: bool = False
    prefill_layout: str = "latency"  # §3.3; "throughput": ranked by prefill capacity (`replica.py`)

    def __post_init__(self) -> None:
        if self.swaps not in SWAPS:
            raise ValueError(f"swaps must be one of {SWAPS}, got {self.swaps!r}")
        if self.time_budget_s <= 0 or self.max_starts < 0:
            raise ValueError("time_budget_s must be positive and max_starts >= 0")


@dataclass(frozen=True)
class DisaggregationResult:
    """The best placement found, as a plan, with how the search went."""

    plan: DisaggregatedPlan
    placement: Placement
    search_s: float
    starts: int  # values of K tried
    evaluations: int  # distinct placements evaluated
    swaps_kept: int  # over all starts
    history: tuple[tuple[float, float], ...]  # (seconds into the search, best flow in req/s so far)

    @property
    def time_to_best_s(self) -> float:
        """Seconds into the search when the best flow was first reached."""
        best = self.placement.value_rps
        return next((t for t, v in self.history if v >= best * (1 - 1e-9)), self.search_s)


def plan_disaggregated(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    config: DisaggregationConfig = DisaggregationConfig(),
    layout_cache: dict | None = None,
) -> DisaggregationResult:
    """HexGen-2's placement of `cluster` for `workload` (module docstring); raises
    NoFeasiblePlanError when no placement serves any request."""
    started = time.perf_counter()
    deadline = started + config.time_budget_s
    graph = build_graph(cluster, model, config.whole_machines)
    if len(graph) < 2:
        raise NoFeasiblePlanError("disaggregation needs at least two nodes: one prefills, one decodes")
    planner = ReplicaPlanner(
        cluster, model, workload, config.whole_machines, layout_cache, config.prefill_layout
    )
    ev = Evaluator(graph, planner)
    rng = random.Random(config.seed)
    best: Placement | None = None
    trail: list[tuple[float, float]] = []  # (perf_counter, flow) of every placement kept
    starts, kept = 0, 0
    for k in _group_counts(num_groups(graph, model, workload), len(graph)):
        if time.perf_counter() >= deadline or (config.max_starts and starts >= config.max_starts):
            break
        starts += 1
        groups = initial_partition(graph, k)
        roles = secondary_partition(graph, groups, config.seed)
        first = max(
            (ev.evaluate(make_state(groups, r)) for r in (roles, flipped(roles))), key=lambda p: p.value_rps
        )
        trail.append((time.perf_counter(), first.value_rps))
        if config.swaps == "random":
            placement, swaps = refine_random(ev, first, deadline, rng, trail)
        else:
            placement, swaps = refine_guided(ev, first, deadline, trail)
        kept += swaps
        if best is None or placement.value_rps > best.value_rps:
            best = placement
    if best is None or best.value_rps <= 0:
        raise NoFeasiblePlanError(
            f"no placement of {len(cluster)} devices into prefill and decode replicas of {model.name} "
            "serves any request (too little memory for two replicas, or no link between them)"
        )
    plan = make_disaggregated_plan(cluster, model, planner.workload, best)
    best_so_far = itertools.accumulate((v for _, v in trail), max)
    history = tuple(zip((t - started for t, _ in trail), best_so_far, strict=True))
    return DisaggregationResult(
        plan, best, time.perf_counter() - started, starts, ev.evaluations, kept, history
    )


def evaluate_disaggregated(
    cluster: Cluster, model: ModelSpec, workload: Workload, plan: DisaggregatedPlan
) -> DisaggregatedPlan:
    """`plan`'s placement (its replicas' devices and roles) scored as the search scores its own:
    each replica laid out and rated in its role, the KV links rated, the max flow (HexGen-2
    §3.3 steps iii and iv). PlanError for devices the cluster lacks or a device used twice."""
    graph = build_graph(cluster, model, whole_machines=False)
    unit_of = {d: u for u, devices in enumerate(graph.units) for d in devices}
    index = {device.id: i for i, device in enumerate(cluster.devices)}
    groups, roles, seen = [], [], set()
    for n, replica in enumerate(plan.replicas):
        unknown = sorted(set(replica.device_ids) - set(index))
        if unknown:
            raise PlanError(f"replica {n} names devices that are not in the cluster: {', '.join(unknown)}")
        if seen & set(replica.device_ids):
            raise PlanError(f"replica {n} uses a device another replica uses")
        seen |= set(replica.device_ids)
        groups.append({unit_of[index[d]] for d in replica.device_ids})
        roles.append(replica.role)
    planner = ReplicaPlanner(cluster, model, workload, False, None, "latency")
    placement = Evaluator(graph, planner).evaluate(make_state(groups, roles))
    return make_disaggregated_plan(cluster, model, planner.workload, placement)


def _group_counts(k: int, nodes: int) -> list[int]:
    """K, K - 1, K + 1, K - 2, ... within [2, nodes]."""
    out = [k]
    for step in range(1, nodes):
        out += [c for c in (k - step, k + step) if 2 <= c <= nodes]
    return out
