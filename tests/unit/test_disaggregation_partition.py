"""HexGen-2 §3.2 on plain data: the graph, the spectral + Kernighan–Lin partition into
memory-balanced groups, and the secondary partition into prefill and decode."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hexswarm.routing.disaggregation import roles as roles_module
from hexswarm.routing.disaggregation.graph import build_graph, cut_weight, memory_spread
from hexswarm.routing.disaggregation.partition import (
    BALANCE_TOLERANCE,
    initial_partition,
    kl_refine,
    num_groups,
    spectral_partition,
)
from hexswarm.routing.disaggregation.roles import DECODE, PREFILL, coarsen, max_cut_sides, secondary_partition
from hexswarm.routing.scenarios.hexgen2_settings import rented_cluster, setting
from hexswarm.routing.scheduler.model_spec import Workload, preset

MODEL = preset("Llama-2-7B")


def mixed_graph():
    return build_graph(rented_cluster([("A100-80G", 4), ("L40", 4), ("A6000", 4)]), MODEL)


def test_the_graph_weighs_nodes_by_memory_and_edges_by_bandwidth():
    cluster = rented_cluster([("A100-80G", 2), ("L40", 2)])
    graph = build_graph(cluster, MODEL)
    assert graph.memory.tolist() == [d.memory_bytes for d in cluster.devices]
    assert graph.bandwidth[0, 1] == cluster.bandwidth[0, 1] and graph.bandwidth[0, 0] == 0
    machines = build_graph(cluster, MODEL, whole_machines=True)
    assert machines.units == ((0, 1), (2, 3))
    assert machines.bandwidth[0, 1] == pytest.approx(cluster.bandwidth[np.ix_([0, 1], [2, 3])].sum())


@pytest.mark.parametrize("k", [2, 3, 4, 6, 8])
def test_the_initial_partition_holds_equal_memory(k):
    graph = mixed_graph()  # 4 x 80 GiB and 8 x 48 GiB
    groups = initial_partition(graph, k)
    assert sorted(u for g in groups for u in g) == list(range(len(graph)))
    assert len(groups) == k and all(groups)
    if k <= 4:
        assert memory_spread(graph, groups) <= BALANCE_TOLERANCE
    else:  # 6 groups of 117 GiB cannot be cut from whole GPUs: within one GPU of each other
        memory = [graph.memory[list(g)].sum() for g in groups]
        assert max(memory) - min(memory) <= graph.memory.min()


def test_spectral_partition_keeps_machines_together():
    graph = build_graph(rented_cluster([("L40", 4), ("L40", 4)]), MODEL)
    assert spectral_partition(graph, 2) == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_kernighan_lin_never_raises_the_cut():
    graph = mixed_graph()
    rng = np.random.default_rng(0)
    for _ in range(20):
        labels = rng.permutation(np.arange(len(graph)) % 3)
        groups = tuple(tuple(np.flatnonzero(labels == k).tolist()) for k in range(3))
        assert cut_weight(graph, kl_refine(graph, groups)) <= cut_weight(graph, groups)
    # three machines of equal GPUs dealt out like cards: KL swaps them back together
    same = build_graph(rented_cluster([("L40", 4), ("A6000", 4), ("L40", 4)]), MODEL)
    interleaved = ((0, 4, 8, 1), (5, 9, 2, 6), (10, 3, 7, 11))
    assert kl_refine(same, interleaved) == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11))


def test_k_follows_memory_and_leaves_room_for_two_roles():
    workload = Workload(s_in=256, s_out=64, max_batch=8)
    assert num_groups(build_graph(setting(4), preset("Llama-2-70B")), preset("Llama-2-70B"), workload) >= 2
    tiny = build_graph(rented_cluster([("L40", 2)]), MODEL)
    assert num_groups(tiny, MODEL, workload) == 2


def _brute_max_cut(weights):
    k = len(weights)
    best = 0.0
    for sides in itertools.product([0, 1], repeat=k - 1):
        x = np.array((0, *sides))
        if x.any():
            best = max(best, float(weights[np.ix_(x == 0, x == 1)].sum()))
    return best


@pytest.mark.parametrize("k", [2, 3, 5, 7])
def test_the_secondary_partition_is_a_max_cut_with_both_roles(k):
    graph = mixed_graph()
    groups = initial_partition(graph, k)
    roles = secondary_partition(graph, groups)
    assert set(roles) == {PREFILL, DECODE}
    weights = coarsen(graph, groups)
    x = np.array([r == DECODE for r in roles])
    assert weights[np.ix_(~x, x)].sum() == pytest.approx(_brute_max_cut(weights))


def test_the_local_search_for_many_groups_also_gives_both_roles(monkeypatch):
    monkeypatch.setattr(roles_module, "EXACT_GROUPS", 1)
    weights = np.random.default_rng(1).uniform(1, 2, (20, 20))
    weights = np.triu(weights, 1) + np.triu(weights, 1).T
    sides = max_cut_sides(weights)
    assert len(sides) == 20 and any(sides) and not all(sides)
