"""The cluster as a graph (HexGen-2 §3.2): nodes weighted by memory, edges by bandwidth.

Each node is a *unit* that a partition moves as one: a GPU (the paper's node), or, for a live
swarm, a whole machine, since a peer is one process serving one TP group on one machine. A
node's weight is its memory m_d (summed over a machine's GPUs), counted as layers of the compute
dtype take it (`cost_model.weight_memory`: a quantized GPU holds more of them); an edge's weight
is the bandwidth beta_dd' between the two nodes (summed over their GPU pairs, which is also how
coarsening merges edges, §3.2 step ii).

A partition is a tuple of groups, each a sorted tuple of node indices; `cut_weight` is the
bandwidth between groups that step (i) minimizes and `memory_spread` the imbalance it keeps low.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import networkx as nx
import numpy as np

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import weight_memory
from hexswarm.routing.scheduler.model_spec import ModelSpec

Group = tuple[int, ...]  # node indices, sorted
Partition = tuple[Group, ...]


@dataclass(frozen=True, eq=False)
class DeviceGraph:
    """G = (D, E) of §3.2 over units of devices."""

    cluster: Cluster
    units: tuple[tuple[int, ...], ...]  # device indices of each node
    memory: np.ndarray  # (U,) bytes per node
    bandwidth: np.ndarray  # (U, U) bytes/s between nodes, 0 on the diagonal

    def __len__(self) -> int:
        return len(self.units)

    def devices(self, group: Sequence[int]) -> tuple[int, ...]:
        """The device indices of a group of nodes, sorted."""
        return tuple(sorted(d for u in group for d in self.units[u]))

    @cached_property
    def graph(self) -> nx.Graph:
        """The networkx form, edge weights scaled to at most 1 (spectral and KL need only ratios)."""
        scale = float(self.bandwidth.max()) or 1.0
        g = nx.Graph()
        g.add_nodes_from((u, {"memory": float(self.memory[u])}) for u in range(len(self.units)))
        rows, cols = np.nonzero(np.triu(self.bandwidth, 1))
        g.add_weighted_edges_from(
            (int(i), int(j), float(self.bandwidth[i, j]) / scale) for i, j in zip(rows, cols, strict=True)
        )
        return g


def build_graph(cluster: Cluster, model: ModelSpec, whole_machines: bool = False) -> DeviceGraph:
    """The graph of `cluster`: one node per GPU, or per machine with `whole_machines`."""
    if whole_machines:
        machines: dict[tuple[str, str], list[int]] = {}
        for i, d in enumerate(cluster.devices):
            machines.setdefault((d.region, d.machine), []).append(i)
        units = tuple(sorted(tuple(devices) for devices in machines.values()))
    else:
        units = tuple((i,) for i in range(len(cluster)))
    memory = np.array([sum(weight_memory(cluster.devices[d], model) for d in unit) for unit in units])
    finite = np.where(np.isfinite(cluster.bandwidth), cluster.bandwidth, 0.0)
    n = len(units)
    bandwidth = np.zeros((n, n))
    for a in range(n):
        for b in range(a + 1, n):
            bandwidth[a, b] = bandwidth[b, a] = finite[np.ix_(units[a], units[b])].sum()
    return DeviceGraph(cluster, units, memory, bandwidth)


def canonical(groups: Sequence[Sequence[int]]) -> Partition:
    """Groups as sorted tuples, in order of their first node: equal partitions compare equal."""
    return tuple(sorted(tuple(sorted(g)) for g in groups if g))


def cut_weight(graph: DeviceGraph, groups: Sequence[Sequence[int]]) -> float:
    """Bandwidth (bytes/s) on edges between different groups."""
    label = np.empty(len(graph), dtype=int)
    for k, group in enumerate(groups):
        label[list(group)] = k
    between = label[:, None] != label[None, :]
    return float(graph.bandwidth[between].sum() / 2)


def group_memory(graph: DeviceGraph, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """(K,) memory of each group in bytes."""
    return np.array([graph.memory[list(g)].sum() for g in groups])


def memory_spread(graph: DeviceGraph, groups: Sequence[Sequence[int]]) -> float:
    """(largest - smallest group memory) / mean group memory: 0 is perfectly balanced."""
    memory = group_memory(graph, groups)
    return float((memory.max() - memory.min()) / memory.mean())
