"""Hepti's uneven tensor-parallel split (routing/hepti/): the MILP against brute force on small
groups, the shares by speed, the modes by memory, the typed error, and the rounding."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest

import hexswarm.routing.hepti.split as split_module
from hexswarm.routing.hepti.lp import _polish, _round, solve_milp, solve_relaxed
from hexswarm.routing.hepti.problem import Device, HeptiProblem, LayerShape
from hexswarm.routing.hepti.split import HeptiInfeasibleError, plan_split, problem_from_dict

SMALL = LayerShape(
    hidden_size=64, num_heads=16, num_kv_heads=8, head_dim=4, intermediate_size=96, num_layers=2
)
FREE_LINK = {"bandwidth": math.inf, "latency_s": 0.0}


def compositions(total: int, parts: int):
    """Every way of writing `total` as `parts` ordered non-negative integers."""
    for bars in itertools.combinations(range(total + parts - 1), parts - 1):
        edges = (-1, *bars, total + parts - 1)
        yield [edges[k + 1] - edges[k] - 1 for k in range(parts)]


def brute_force(problem: HeptiProblem, memory: bool) -> float:
    """The least step time over every integer split (inf when none fits)."""
    n, best = len(problem.devices), math.inf
    for groups in compositions(problem.groups, n):
        for tiles in compositions(problem.tiles, n):
            if memory and not problem.split_fits(groups, tiles):
                continue
            if min(groups + tiles) < problem.least_units:
                continue
            best = min(best, problem.step_time(groups, tiles)[0])
    return best


def random_problem(rng: np.random.Generator, kv_heads: int) -> HeptiProblem:
    shape = LayerShape(64, 16, kv_heads, 4, 96, num_layers=2)
    n = int(rng.integers(2, 5))
    probe = HeptiProblem((Device("x", 1.0, 0.0),), shape, tile=16)
    whole = probe.groups * probe.weight_bytes("attention") + probe.tiles * probe.weight_bytes("mlp")
    devices = tuple(
        Device(
            f"d{i}",
            flops=float(rng.uniform(1e8, 4e8)),
            free_bytes=float(whole * rng.uniform(0.15, 0.8)),
            bandwidth=float(rng.uniform(1e6, 1e8)),
            latency_s=float(rng.uniform(0, 2e-4)),
        )
        for i in range(n)
    )
    return HeptiProblem(devices, shape, tokens=int(rng.integers(1, 5)), tile=16)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("memory", [False, True])
def test_milp_step_time_is_optimal_against_brute_force(seed, memory):
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, kv_heads=int(rng.choice([4, 8, 16])) if not memory else 4)
    best = brute_force(problem, memory)
    shares = solve_milp(problem, memory)
    if best == math.inf:
        assert shares is None
        return
    groups, tiles = shares
    assert sum(groups) == problem.groups and sum(tiles) == problem.tiles
    if memory:
        assert problem.split_fits(groups, tiles)
    assert problem.step_time(groups, tiles)[0] == pytest.approx(best, rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_every_device_keeps_a_unit_of_each_block_and_stays_optimal(seed):
    """What a live group asks (peer/tp/partition.py): no rank with zero heads or columns."""
    rng = np.random.default_rng(100 + seed)
    problem = dataclasses.replace(random_problem(rng, kv_heads=4), every_device=True)
    groups, tiles = solve_milp(problem, memory=False)
    assert min(groups + tiles) >= 1
    assert problem.step_time(groups, tiles)[0] == pytest.approx(brute_force(problem, False), rel=1e-6)
    relaxed = solve_relaxed(problem, memory=False)
    assert min(relaxed[0] + relaxed[1]) >= 1 and sum(relaxed[0]) == problem.groups


def test_every_device_needs_a_unit_for_each_device():
    shape = LayerShape(64, 4, 2, 16, 96)
    with pytest.raises(ValueError, match="3 devices cannot each take one of 2 KV-head groups"):
        HeptiProblem(tuple(Device(f"d{i}", 1.0, 1e9) for i in range(3)), shape, every_device=True)


def two_devices(speed_ratio: float, free: float = 1e12) -> HeptiProblem:
    shape = LayerShape(hidden_size=256, num_heads=24, num_kv_heads=12, head_dim=16, intermediate_size=3072)
    devices = (Device("fast", speed_ratio * 1e9, free), Device("slow", 1e9, free, **FREE_LINK))
    return HeptiProblem(devices, shape)


def test_twice_as_fast_gets_about_twice_the_share():
    split = plan_split(two_devices(2.0))
    fast, slow = split.shares
    assert split.mode == "weight-stationary"
    assert (fast.kv_groups, slow.kv_groups) == (8, 4) and (fast.heads, slow.heads) == (16, 8)
    assert (fast.mlp_columns, slow.mlp_columns) == (2048, 1024)
    assert fast.compute_s == pytest.approx(slow.compute_s)
    assert split.step_time_s < split.even_step_time_s


def test_equal_devices_split_evenly():
    split = plan_split(two_devices(1.0))
    assert [(s.kv_groups, s.mlp_columns) for s in split.shares] == [(6, 1536), (6, 1536)]
    assert split.step_time_s == pytest.approx(split.even_step_time_s)


def test_a_device_whose_link_costs_more_than_it_saves_is_left_out():
    problem = two_devices(1.0)
    slow_link = Device("far", 1e9, 1e12, bandwidth=1e3, latency_s=1.0)
    split = plan_split(HeptiProblem((problem.devices[0], slow_link), problem.shape))
    assert [(s.kv_groups, s.mlp_columns) for s in split.shares] == [(12, 3072), (0, 0)]


def test_when_memory_binds_a_tiled_mode_respects_it():
    problem = two_devices(2.0)
    whole = sum(s.weight_bytes for s in plan_split(problem).shares)
    tight = HeptiProblem(
        (Device("fast", 2e9, 0.4 * whole), Device("slow", 1e9, 0.7 * whole, **FREE_LINK)), problem.shape
    )
    split = plan_split(tight)
    assert split.mode == "1d-tiled"
    assert all(s.weight_bytes <= s.free_bytes for s in split.shares)
    assert sum(s.heads for s in split.shares) == 24 and sum(s.mlp_columns for s in split.shares) == 3072
    assert split.shares[0].weight_bytes > 0.35 * whole  # the fast one still takes what it can hold


def test_sixteen_devices_short_of_memory_tile_in_2d():
    shape = LayerShape(hidden_size=512, num_heads=32, num_kv_heads=32, head_dim=16, intermediate_size=2048)
    probe = HeptiProblem((Device("x", 1.0, 0.0),), shape)
    whole = probe.groups * probe.weight_bytes("attention") + probe.tiles * probe.weight_bytes("mlp")
    devices = tuple(
        Device(f"d{i}", (2e9 if i % 2 else 1e9), whole / 12 if i else whole / 40, **FREE_LINK)
        for i in range(16)
    )
    split = plan_split(HeptiProblem(devices, shape))
    assert split.mode == "2d-tiled" and split.solver == "lp-rounded"
    assert all(s.weight_bytes <= s.free_bytes for s in split.shares)
    assert sum(s.kv_groups for s in split.shares) == 32 and sum(s.mlp_columns for s in split.shares) == 2048


def test_no_split_fits_raises_the_typed_error_in_one_line():
    problem = two_devices(2.0, free=1e3)
    with pytest.raises(HeptiInfeasibleError, match="B of weights") as total:
        plan_split(problem)
    assert isinstance(total.value, ValueError) and "\n" not in str(total.value)
    # enough memory in all, but one KV-head group is larger than any single device's
    shape = LayerShape(hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64, intermediate_size=64)
    group = HeptiProblem((Device("x", 1.0, 0.0),), shape).weight_bytes("attention")
    devices = tuple(Device(f"d{i}", 1e9, 0.9 * group) for i in range(4))
    with pytest.raises(HeptiInfeasibleError, match="one KV-head group"):
        plan_split(HeptiProblem(devices, shape))


def test_relaxation_rounds_to_whole_groups_with_exact_sums_and_memory():
    shape = LayerShape(hidden_size=256, num_heads=32, num_kv_heads=8, head_dim=16, intermediate_size=1000)
    rng = np.random.default_rng(7)
    devices = tuple(
        Device(f"d{i}", float(rng.uniform(1e9, 5e9)), 1e12, bandwidth=1e9, latency_s=1e-6) for i in range(11)
    )
    problem = HeptiProblem(devices, shape, tokens=4)
    assert problem.tile_width == 50 and problem.tiles == 20  # the largest divisor of 1000 up to 64
    split = plan_split(problem)
    assert split.solver == "lp-rounded"
    assert sum(s.heads for s in split.shares) == 32 and all(s.heads % 4 == 0 for s in split.shares)
    assert sum(s.mlp_columns for s in split.shares) == 1000 and all(
        s.mlp_columns % 50 == 0 for s in split.shares
    )
    # the relaxation's rounded split is close to the exact one
    exact = problem.step_time(*solve_milp(problem, memory=False))[0]
    assert split.step_time_s <= 1.25 * exact
    assert problem.step_time(*solve_relaxed(problem, memory=False))[0] == split.step_time_s


def test_largest_remainder_rounding_respects_memory():
    problem = HeptiProblem(
        (Device("a", 1e9, 1e12), Device("b", 1e9, 0.0), Device("c", 1e9, 1e12)), SMALL, tile=16
    )
    groups, tiles = _round(problem, ([2.5, 0.0, 5.5], [3.4, 0.0, 2.6]), memory=True)
    assert sum(groups) == 8 and sum(tiles) == 6 and groups[1] == tiles[1] == 0
    assert _round(problem, ([2.6, 2.0, 3.4], [3.0, 0.0, 3.0]), memory=True) is None  # b cannot hold its floor


def test_polishing_moves_units_off_the_slowest_device_and_keeps_sums():
    problem = HeptiProblem((Device("a", 1e9, 1e12), Device("b", 1e9, 1e12, **FREE_LINK)), SMALL, tile=16)
    groups, tiles = _polish(problem, ([8, 0], [6, 0]), memory=False)
    assert (groups, tiles) == ([4, 4], [3, 3])
    assert problem.step_time(groups, tiles)[0] < problem.step_time([8, 0], [6, 0])[0]


def test_milp_beats_or_ties_the_relaxation_on_small_groups(monkeypatch):
    rng = np.random.default_rng(3)
    for _ in range(5):
        problem = random_problem(rng, kv_heads=8)
        exact = solve_milp(problem, memory=False)
        rounded = solve_relaxed(problem, memory=False)
        assert problem.step_time(*exact)[0] <= problem.step_time(*rounded)[0] * (1 + 1e-9)
    monkeypatch.setattr(split_module, "MILP_MAX_DEVICES", 1)
    assert plan_split(problem).solver == "lp-rounded"


def test_group_file_and_record():
    shape = LayerShape.from_hf_config(
        {
            "hidden_size": 576,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "head_dim": 64,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "model_type": "llama",
        }
    )
    assert (shape.heads_per_group, shape.num_layers, shape.gated_mlp) == (3, 30, True)
    raw = {
        "tokens": 2,
        "devices": [
            {"name": "leader", "flops": 2e11, "free_bytes": 8e9},
            {"name": "box", "flops": 1e11, "free_bytes": 8e9, "bandwidth": 1e10, "latency_s": 2e-6},
        ],
    }
    split = plan_split(problem_from_dict(raw, shape))
    record = json.loads(json.dumps(split.to_dict()))
    assert record["mode"] == "weight-stationary" and record["tokens"] == 2
    assert [s["device"] for s in record["shares"]] == ["leader", "box"]
    for bad, message in (
        ({"devices": []}, "non-empty"),
        ({"devices": [{"name": "a", "flops": 1}]}, "needs name, flops, free_bytes"),
        ({"devices": [{"name": "a", "flops": -1, "free_bytes": 1}]}, "must be positive"),
    ):
        with pytest.raises(ValueError, match=message):
            problem_from_dict(bad, shape)
