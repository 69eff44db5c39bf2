"""HexGen-2 §3.3 on plain data: the flow network's max flow against a linear program and
brute force, its minimum cut, and the KV link of Table 1."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

from hexswarm.routing.disaggregation.flow import PERIOD_S, SINK, SOURCE, flow_network, max_flow
from hexswarm.routing.disaggregation.kv_transfer import kv_bytes_per_token, kv_link
from hexswarm.routing.scenarios.hexgen2_settings import rented_cluster
from hexswarm.routing.scheduler.model_spec import preset
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout, StageLayout


def random_network(seed: int):
    """Capacities in whole requests per period (the flow works in those units)."""
    rng = np.random.default_rng(seed)
    units = lambda: int(rng.integers(1, 50)) / PERIOD_S  # noqa: E731
    prefill = [units() for _ in range(int(rng.integers(1, 4)))]
    decode = [units() for _ in range(int(rng.integers(1, 4)))]
    kv = {(i, j): units() for i in range(len(prefill)) for j in range(len(decode)) if rng.random() < 0.7}
    return prefill, decode, kv


def lp_max_flow(graph) -> float:
    """The max flow as an LP over the edges (scipy's HiGHS): conservation at inner nodes."""
    edges = list(graph.edges)
    big = 1e6
    bounds = [(0, graph.edges[e].get("capacity", big)) for e in edges]
    inner = [n for n in graph.nodes if n not in (SOURCE, SINK)]
    a_eq = np.zeros((len(inner), len(edges)))
    for r, node in enumerate(inner):
        for c, (u, v) in enumerate(edges):
            a_eq[r, c] = (v == node) - (u == node)
    cost = [-1.0 if u == SOURCE else 0.0 for u, _ in edges]
    result = linprog(cost, A_eq=a_eq, b_eq=np.zeros(len(inner)), bounds=bounds, method="highs")
    return -result.fun


def brute_min_cut(graph) -> float:
    inner = [n for n in graph.nodes if n not in (SOURCE, SINK)]
    best = np.inf
    for mask in itertools.product([0, 1], repeat=len(inner)):
        side = {SOURCE} | {n for n, m in zip(inner, mask, strict=True) if m}
        cut = sum(
            graph.edges[u, v].get("capacity", np.inf) for u, v in graph.edges if u in side and v not in side
        )
        best = min(best, cut)
    return best


@pytest.mark.parametrize("seed", range(8))
def test_max_flow_equals_the_lp_and_the_min_cut(seed):
    prefill, decode, kv = random_network(seed)
    graph = flow_network(prefill, decode, kv)
    result = max_flow(prefill, decode, kv)
    assert result.value_rps * PERIOD_S == pytest.approx(lp_max_flow(graph), abs=1e-6)
    assert result.value_rps * PERIOD_S == pytest.approx(brute_min_cut(graph), abs=1e-6)
    assert sum(result.prefill_rps) == pytest.approx(result.value_rps)
    assert sum(result.decode_rps) == pytest.approx(result.value_rps)


@pytest.mark.parametrize("seed", range(8))
def test_the_bottlenecks_are_a_saturated_cut(seed):
    prefill, decode, kv = random_network(seed)
    result = max_flow(prefill, decode, kv)
    capacity = sum(
        prefill[e[1]] if e[0] == "prefill" else decode[e[1]] if e[0] == "decode" else kv[e[1], e[2]]
        for e in result.bottlenecks
    )
    assert capacity == pytest.approx(result.value_rps)
    for edge in result.bottlenecks:
        if edge[0] == "kv":
            assert result.kv_rps[edge[1], edge[2]] == pytest.approx(kv[edge[1], edge[2]])


def test_no_link_no_flow():
    result = max_flow([1.0], [1.0], {})
    assert result.value_rps == 0 and result.kv_rps == {}


def test_the_kv_link_carries_each_layers_cache_between_the_gpus_that_hold_it():
    model = preset("Llama-2-7B")
    cluster = rented_cluster([("L40", 2), ("A6000", 2)])
    prefill = PipelineLayout((StageLayout((0, 1), 0, 32),), 0.0, 0.0)  # TP 2, every layer
    decode = PipelineLayout((StageLayout((2,), 0, 16), StageLayout((3,), 16, 32)), 0.0, 0.0)
    link = kv_link(cluster, model, prefill, decode)
    # two overlaps of 16 layers, each over one GPU pair (the smaller TP group has one rank)
    seconds = cluster.latency[0, 2] + 100 * kv_bytes_per_token(model, 16) / cluster.bandwidth[0, 2]
    assert link.seconds(100) == pytest.approx(seconds)
    assert link.capacity_rps(100) == pytest.approx(1 / seconds)
    assert kv_bytes_per_token(model, 1) == 2 * model.kv_width * model.dtype_bytes
