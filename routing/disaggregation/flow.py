"""Step (iv) of HexGen-2 §3.3: the flow network of a placement and its max flow.

Nodes: a source and a sink (both the coordinator h, which dispatches requests and collects
them), and for every prefill replica phi_i and decode replica delta_j an in-node and an
out-node. Edges, with capacities in requests per `PERIOD_S` (integers, so that the flow
algorithm works in exact arithmetic):

* (phi_i^in, phi_i^out), (delta_j^in, delta_j^out): the replica's capacity (`replica.py`);
* (source, phi_i^in), (delta_j^out, sink): the coordinator's links, which carry only token ids
  and are left unbounded;
* (phi_i^out, delta_j^in): the KV cache link (`kv_transfer.py`), one request's cache after the other.

networkx's preflow-push (Cheriyan & Maheshwari 1989) gives the max flow and every edge's flow.
One unit of flow is one request through a replica or a link per period. The flows from each
prefill replica to the decode replicas, normalized, are the dispatch ratios the coordinator
follows (`plan_record.DisaggregatedPlan.dispatch`; requests go to each decode replica in proportion, spread evenly rather than in bursts).
The edges of a minimum cut (those the residual graph cannot cross) are the *bottlenecks* that
§3.4's max-flow-guided swaps work on; replicas whose flow stays below capacity are *underused*.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
from networkx.algorithms.flow import preflow_push

PERIOD_S = 3600.0  # T of §3.3: capacities are requests per hour (the paper's example is 10 min)
SOURCE, SINK = "source", "sink"


@dataclass(frozen=True)
class FlowResult:
    """The max flow of one placement, in requests per second."""

    value_rps: float
    prefill_rps: tuple[float, ...]  # flow through each prefill replica
    decode_rps: tuple[float, ...]  # flow through each decode replica
    kv_rps: Mapping[tuple[int, int], float]  # (prefill i, decode j) -> flow on their KV link
    bottlenecks: frozenset  # min-cut edges: ("prefill", i), ("decode", j), ("kv", i, j)


def flow_network(
    prefill_rps: Sequence[float], decode_rps: Sequence[float], kv_rps: Mapping[tuple[int, int], float]
) -> nx.DiGraph:
    """The directed graph of the module docstring (capacities in requests per PERIOD_S)."""
    g = nx.DiGraph()
    for i, cap in enumerate(prefill_rps):
        g.add_edge(SOURCE, ("p", i, "in"))  # no capacity attribute: unbounded
        g.add_edge(("p", i, "in"), ("p", i, "out"), capacity=_units(cap))
    for j, cap in enumerate(decode_rps):
        g.add_edge(("d", j, "in"), ("d", j, "out"), capacity=_units(cap))
        g.add_edge(("d", j, "out"), SINK)
    for (i, j), cap in sorted(kv_rps.items()):
        if _units(cap) > 0:
            g.add_edge(("p", i, "out"), ("d", j, "in"), capacity=_units(cap))
    g.add_nodes_from((SOURCE, SINK))
    return g


def max_flow(
    prefill_rps: Sequence[float], decode_rps: Sequence[float], kv_rps: Mapping[tuple[int, int], float]
) -> FlowResult:
    """Preflow-push on the flow network; flows back in requests per second."""
    g = flow_network(prefill_rps, decode_rps, kv_rps)
    if not prefill_rps or not decode_rps:
        return FlowResult(0.0, (0.0,) * len(prefill_rps), (0.0,) * len(decode_rps), {}, frozenset())
    residual = preflow_push(g, SOURCE, SINK)

    def flow(u, v) -> float:  # the residual network leaves out edges of capacity 0
        edge = residual[u].get(v) if u in residual else None
        return max(0.0, edge["flow"]) / PERIOD_S if edge else 0.0

    prefill = tuple(flow(("p", i, "in"), ("p", i, "out")) for i in range(len(prefill_rps)))
    decode = tuple(flow(("d", j, "in"), ("d", j, "out")) for j in range(len(decode_rps)))
    kv = {(u[1], v[1]): flow(u, v) for u, v in g.edges if u[0:1] == ("p",) and v[0:1] == ("d",)}
    value = residual.graph["flow_value"] / PERIOD_S
    return FlowResult(value, prefill, decode, kv, _min_cut(g, residual))


def _units(rps: float) -> int:
    return max(0, int(rps * PERIOD_S))


def _min_cut(g: nx.DiGraph, residual: nx.DiGraph) -> frozenset:
    """The edges from the nodes the source still reaches in the residual graph to the rest."""
    reached, queue = {SOURCE}, deque([SOURCE])
    while queue:
        u = queue.popleft()
        for v, attr in residual[u].items():
            if v not in reached and attr["capacity"] - attr["flow"] > 0:
                reached.add(v)
                queue.append(v)
    cut = set()
    for u, v in g.edges:
        if u in reached and v not in reached:
            if u[0] == "p" and v[0] == "d":
                cut.add(("kv", u[1], v[1]))
            elif u != SOURCE and v != SINK:
                cut.add(("prefill" if u[0] == "p" else "decode", u[1]))
    return frozenset(cut)
