"""What a plan change costs: peers' layer ranges, the moves between two plans, and their load times.

In a swarm a peer (a machine: one process, one TP group) serves one layer range. When a new plan
gives it another range, it must read the new layers' weights before it can serve them; we charge
that move

    load_s(peer) = layer_bytes x (layers of the new range the peer does not hold yet) / load_bandwidth

(all of the new range when its TP group changes: every shard differs). A peer that had no range
(it just joined, or was idle) loads its range the same way but is not counted as a move: it
served nothing before.

How a moved peer is valued while it loads depends on how it moves. A live peer moves
make-before-break (`peer/range_move.py`): when its memory holds both ranges (`both_fit`) it loads
the whole new range as a second stack while its old range keeps serving, then switches; so the
move delays only the new range's capacity, and the current pipeline it served goes on until it
switches (`old_pipeline_ends`). When both ranges do not fit (or its TP group changes) it drops
what it will not keep, loads the missing layers, and serves nothing meanwhile
(break-before-make, the old rule of this module, still available for comparison).

`horizon_attainment` values a plan over the `horizon_s` after it is published: a pipeline serves
only once every peer in it has loaded, so with t_0 = 0 < t_1 < ... the distinct ready times
(capped at the horizon H) and A(P) the analytic attainment of the pipelines P (`fitness.estimate`:
their SLO capacities sharing the offered rate),

    A_H(plan) = (1 / H) sum_k (t_{k+1} - t_k) A({pipelines ready at t_k}).

Pipelines of the current plan that keep serving until some time e (a make-before-break move not
yet switched) count in A(...) while t_k < e; their e are among the t_k. A plan that moves no
peer has A_H = A. The re-planner (`replan.py`) compares plans by A_H, with the load bandwidth,
horizon and publishing margin of `MoveCosts`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import group_max_layers
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout
from hexswarm.routing.scheduler.plan import StagePlan
from hexswarm.routing.scheduler.simulation.fitness import PipelineCapacity, estimate

# A peer reads its new layers at this rate by default: a local NVMe read of cached weights with
# their conversion (~1 GB/s); a peer that downloads them over the network is slower (pass less).
DEFAULT_LOAD_BANDWIDTH = 1e9  # bytes/s


# The layer range a peer serves with which of its devices (leader first): a plan's stage.
Assignment = StagePlan


@dataclass(frozen=True)
class MoveCosts:
    """How moves are charged and when a new plan is worth publishing."""

    load_bandwidth: float = DEFAULT_LOAD_BANDWIDTH  # bytes/s a peer reads new layers at
    horizon_s: float = 600.0  # H: the plan is valued over this long after publication
    margin: float = 0.02  # publish only if A_H beats the current plan's by this much
    tie: float = 0.005  # candidates within this of the best A_H are equally good
    # a moved peer keeps serving its old range while it loads the new one when both fit
    # (module docstring); False values every move as if the peer served nothing meanwhile
    make_before_break: bool = True
    move_placed: bool = True  # False: a re-plan only places new or idle peers (an ablation)

    def __post_init__(self) -> None:
        if self.load_bandwidth <= 0 or self.horizon_s < 0 or self.margin < 0 or self.tie < 0:
            raise ValueError("load_bandwidth must be positive; horizon, margin and tie not negative")


@dataclass(frozen=True)
class Move:
    """A peer that changes its range; `old` None means it had none (not counted as a move)."""

    machine: str
    old: tuple[int, int] | None
    new: tuple[int, int]
    load_s: float


def machine_of(cluster: Cluster, device_id: str) -> str:
    return cluster.devices[cluster.index(device_id)].machine


def layout_assignments(cluster: Cluster, layouts: Sequence[PipelineLayout]) -> dict[str, Assignment]:
    """Peer (machine) -> its range, for pipelines laid out with one stage per machine."""
    out = {}
    for layout in layouts:
        for stage in layout.stages:
            ids = tuple(cluster.devices[d].id for d in stage.devices)
            out[cluster.devices[stage.devices[0]].machine] = Assignment(ids, stage.start, stage.end)
    return out


def load_seconds(
    model: ModelSpec, old: Assignment | None, new: Assignment, load_bandwidth: float = DEFAULT_LOAD_BANDWIDTH
) -> float:
    """Seconds a peer needs to load `new` when it holds `old` (module docstring)."""
    if old is None or old.device_ids != new.device_ids:
        layers = new.layers
    else:
        layers = len(set(range(new.start, new.end)) - set(range(old.start, old.end)))
    return layers * model.layer_bytes / load_bandwidth


def diff(
    model: ModelSpec,
    current: Mapping[str, Assignment],
    new: Mapping[str, Assignment],
    load_bandwidth: float = DEFAULT_LOAD_BANDWIDTH,
) -> tuple[list[Move], dict[str, float]]:
    """The moves from `current` to `new` (peers in both whose range changes) and every peer's
    load time under `new` (0 for peers that keep their range)."""
    moves, load = [], {}
    for machine, assignment in sorted(new.items()):
        old = current.get(machine)
        if old == assignment:
            load[machine] = 0.0
            continue
        load[machine] = load_seconds(model, old, assignment, load_bandwidth)
        if old is not None:
            moves.append(
                Move(machine, (old.start, old.end), (assignment.start, assignment.end), load[machine])
            )
    return moves, load


def ready_times(
    cluster: Cluster, layouts: Sequence[PipelineLayout], load: Mapping[str, float]
) -> list[float]:
    """Per pipeline: when its last peer has loaded its range."""
    return [
        max((load.get(cluster.devices[s.devices[0]].machine, 0.0) for s in layout.stages), default=0.0)
        for layout in layouts
    ]


def both_fit(
    cluster: Cluster, model: ModelSpec, workload: Workload, old: Assignment, new: Assignment
) -> bool:
    """Whether a peer can hold its old range and its new one at once (peer/range_move.py loads
    the new range as a second stack while the old one serves): same TP group, memory for both."""
    if old.device_ids != new.device_ids:
        return False
    devs = [cluster.index(d) for d in new.device_ids]
    tokens = workload.s_in_max + workload.s_out
    cap = group_max_layers(cluster, devs, model, tokens, workload.max_batch)
    return old.layers + new.layers <= cap


def make_before_break_loads(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    current: Mapping[str, Assignment],
    new: Mapping[str, Assignment],
    load: Mapping[str, float],
    load_bandwidth: float = DEFAULT_LOAD_BANDWIDTH,
) -> tuple[dict[str, float], frozenset[str]]:
    """Load times when moved peers move make-before-break where both ranges fit, and those peers
    (they load the whole new range as a second stack, so their load is all of it)."""
    out, keep = dict(load), set()
    for machine, assignment in new.items():
        old = current.get(machine)
        if old is None or old == assignment or not both_fit(cluster, model, workload, old, assignment):
            continue
        keep.add(machine)
        out[machine] = load_seconds(model, None, assignment, load_bandwidth)
    return out, frozenset(keep)


def old_pipeline_ends(
    cluster: Cluster,
    kept: Sequence[PipelineLayout],
    layouts: Sequence[PipelineLayout],
    load: Mapping[str, float],
    keeps_old: frozenset[str],
) -> list[float]:
    """Per current pipeline (`kept`, whole now): until when it keeps serving under the new plan.

    0 when it is in the new plan unchanged (the new plan counts it) or a peer of it moves
    break-before-make; else the first moment one of its peers stops serving it: a
    make-before-break mover switches once loaded, a peer that stays but joins another pipeline
    serves that one once it is ready. Peers the plan leaves out keep their range (inf)."""
    ready_at = ready_times(cluster, layouts, load)
    new_ready = dict(zip(map(_stage_key, layouts), ready_at, strict=True))
    pipeline_of = {}
    for layout, ready in zip(layouts, ready_at, strict=True):
        for stage in layout.stages:
            pipeline_of[cluster.devices[stage.devices[0]].machine] = (_stage_key(layout), ready)
    ends = []
    for layout in kept:
        key = _stage_key(layout)
        if key in new_ready:
            ends.append(0.0)
            continue
        end = float("inf")
        for stage in layout.stages:
            machine = cluster.devices[stage.devices[0]].machine
            if machine not in pipeline_of:
                continue
            if load.get(machine, 0.0) > 0 and machine not in keeps_old:
                end = 0.0  # break-before-make: it stops serving at once
            elif machine in keeps_old:
                end = min(end, load[machine])
            else:
                end = min(end, pipeline_of[machine][1])
        ends.append(end)
    return ends


def _stage_key(layout: PipelineLayout) -> tuple:
    return tuple((tuple(s.devices), s.start, s.end) for s in layout.stages)


def horizon_attainment(
    capacities: Sequence[PipelineCapacity],
    ready: Sequence[float],
    rate: float,
    horizon_s: float,
    old: Sequence[tuple[PipelineCapacity, float]] = (),
) -> float:
    """A_H of the module docstring; `old`: current pipelines serving until their end time."""
    if horizon_s <= 0:
        return estimate(list(capacities), rate).attainment
    old = [(c, e) for c, e in old if e > 0]
    times = sorted(
        {0.0} | {min(r, horizon_s) for r in ready} | {min(e, horizon_s) for _, e in old} | {horizon_s}
    )
    total = 0.0
    for a, b in zip(times, times[1:], strict=False):
        live = [c for c, r in zip(capacities, ready, strict=True) if r <= a] + [c for c, e in old if e > a]
        total += (b - a) * (estimate(live, rate).attainment if live else 0.0)
    return total / horizon_s
