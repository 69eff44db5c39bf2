"""A placement (groups of nodes, each with a role) evaluated by steps (iii) and (iv) of HexGen-2
§3.3: every group laid out and rated in its role, every prefill-decode pair's KV link rated,
and the max flow through all of it. `Evaluator` caches placements, replicas and links, since the
refinement of §3.4 evaluates many placements that differ in two groups."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hexswarm.routing.disaggregation.flow import FlowResult, max_flow
from hexswarm.routing.disaggregation.graph import DeviceGraph, Group
from hexswarm.routing.disaggregation.kv_transfer import KvLink, kv_link
from hexswarm.routing.disaggregation.replica import Replica, ReplicaPlanner
from hexswarm.routing.disaggregation.roles import DECODE, PREFILL

State = tuple[tuple[Group, str], ...]  # (group of nodes, role), sorted by group


def make_state(groups: Sequence[Sequence[int]], roles: Sequence[str]) -> State:
    """The canonical state of groups and their roles (empty groups dropped)."""
    return tuple(sorted((tuple(sorted(g)), r) for g, r in zip(groups, roles, strict=True) if g))


@dataclass(frozen=True, eq=False)
class Placement:
    """An evaluated state: prefill replicas and decode replicas (in state order), their KV links
    and the max flow, whose prefill / decode indices are positions in `prefill` / `decode`."""

    state: State
    prefill: tuple[Replica, ...]
    decode: tuple[Replica, ...]
    kv: dict[tuple[int, int], KvLink]  # (prefill i, decode j) -> link, for replicas with layouts
    kv_rps: dict[tuple[int, int], float]  # their capacities at the mean prompt
    flow: FlowResult

    @property
    def value_rps(self) -> float:
        return self.flow.value_rps

    def group_of(self, role: str, index: int) -> int:
        """Position in `state` of the `index`-th replica of `role`."""
        return [k for k, (_, r) in enumerate(self.state) if r == role][index]


class Evaluator:
    """Evaluates states over one graph, with caches (module docstring)."""

    def __init__(self, graph: DeviceGraph, planner: ReplicaPlanner):
        self.graph, self.planner = graph, planner
        self.s_in = float(planner.workload.s_in)
        self._placements: dict[State, Placement] = {}
        self._links: dict[tuple[tuple[int, ...], tuple[int, ...]], KvLink] = {}
        self.evaluations = 0  # distinct states evaluated

    def evaluate(self, state: State) -> Placement:
        if state not in self._placements:
            self.evaluations += 1
            self._placements[state] = self._evaluate(state)
        return self._placements[state]

    def _evaluate(self, state: State) -> Placement:
        replicas = {
            role: tuple(self.planner.replica(role, self.graph.devices(g)) for g, r in state if r == role)
            for role in (PREFILL, DECODE)
        }
        kv, kv_rps = {}, {}
        for i, p in enumerate(replicas[PREFILL]):
            for j, d in enumerate(replicas[DECODE]):
                if p.layout is not None and d.layout is not None:
                    kv[i, j] = self._link(p, d)
                    kv_rps[i, j] = kv[i, j].capacity_rps(self.s_in)
        flow = max_flow(
            [r.capacity_rps for r in replicas[PREFILL]], [r.capacity_rps for r in replicas[DECODE]], kv_rps
        )
        return Placement(state, replicas[PREFILL], replicas[DECODE], kv, kv_rps, flow)

    def _link(self, p: Replica, d: Replica) -> KvLink:
        key = (p.devices, d.devices)
        if key not in self._links:
            self._links[key] = kv_link(self.graph.cluster, self.planner.model, p.layout, d.layout)
        return self._links[key]
