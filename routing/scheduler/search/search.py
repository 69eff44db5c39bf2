"""Where a placement search starts: `search` picks the search a cluster needs.

* With pinned stages (peers started with a fixed layer range), the search around them
  (`pinned_stages.search_around`): pipelines through the pinned stages first, then a search of
  the free devices.
* Clusters of more than `hierarchical.FLAT_LIMIT` devices in several regions, region by region
  (`hierarchical.search_by_region`).
* Otherwise HexGen's genetic search over the whole cluster (`genetic.genetic_search`, §4.3).

The first two search their parts with this same function, which is handed to them (`Search`):
a part may itself hold several regions, or, under the throughput objective, need its own
saturating rate. Passing it keeps each module below this one, so no import runs in a circle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hexswarm.routing.scheduler.bounds.capacity import saturating_workload
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.plan import Plan, StagePlan
from hexswarm.routing.scheduler.search.genetic import SearchConfig, genetic_search
from hexswarm.routing.scheduler.search.hierarchical import FLAT_LIMIT, search_by_region
from hexswarm.routing.scheduler.search.pinned_stages import search_around
from hexswarm.routing.scheduler.search.search_result import Progress, SearchResult

DEFAULT_CONFIG = SearchConfig()


def search(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    config: SearchConfig = DEFAULT_CONFIG,
    previous: Plan | None = None,
    progress: Callable[[Progress], None] | None = None,
    layout_cache: dict | None = None,
    pinned: Sequence[StagePlan] = (),
) -> SearchResult:
    """Runs the search the cluster needs (module docstring) and returns the best plan; raises
    NoFeasiblePlanError.

    `layout_cache`: a dict kept between searches on the same network (first plan, then re-plans
    after devices leave or join) so that a warm re-plan reuses the first search's layouts.

    `pinned`: stages of fixed peers (their devices serving a fixed [start, end)); the plan uses
    them in pipelines but never changes them (`pinned_stages.py` says how).
    """
    if workload.objective == "throughput":  # offer more than any plan serves: fitness ~ capacity
        workload = saturating_workload(cluster, model, workload)
    if pinned:
        return search_around(cluster, model, workload, config, previous, layout_cache, pinned, search)
    if config.one_stage_per_machine:
        check_one_type_per_machine(cluster)
    regions = {d.region for d in cluster.devices}
    if len(cluster) > FLAT_LIMIT and len(regions) > 1:
        return search_by_region(cluster, model, workload, config, previous, layout_cache, search)
    return genetic_search(cluster, model, workload, config, previous, progress, layout_cache)


def check_one_type_per_machine(cluster: Cluster) -> None:
    """A swarm peer is one TP group, of one GPU type (§4.2): a machine of mixed types would be
    two buckets, which the DP could give two stages; refuse such clusters."""
    types: dict[str, set[str]] = {}
    for d in cluster.devices:
        types.setdefault(f"{d.region}/{d.machine}", set()).add(d.type)
    mixed = sorted(m for m, t in types.items() if len(t) > 1)
    if mixed:
        raise ValueError(
            f"one_stage_per_machine needs one GPU type per machine; mixed: {', '.join(mixed[:5])}"
        )
