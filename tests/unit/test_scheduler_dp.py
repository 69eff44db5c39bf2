"""Algorithm 1 (HexGen §4.2) against brute force over every ordered stage sequence of small groups."""

from __future__ import annotations

import math

import pytest

from hexswarm.routing.baselines.symmetric import SymmetricDP
from hexswarm.routing.scenarios.hexgen_clusters import scenario
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import stage_memory
from hexswarm.routing.scheduler.model_spec import Workload, preset
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import (
    TP_DEGREES,
    PipelineDP,
    StageLayout,
    buckets_of,
)

WORKLOAD = Workload(rate=1.0, s_in=128, s_out=32, num_requests=50)


def small_cluster() -> Cluster:
    devices = [{"id": f"a{i}", "type": "A5000", "machine": "m1", "region": "r"} for i in range(4)]
    devices += [{"id": f"b{i}", "type": "A6000", "machine": "m2", "region": "r"} for i in range(2)]
    devices += [{"id": "c0", "type": "RTX3090", "machine": "m3", "region": "s"}]
    return Cluster.from_dict({"devices": devices})


def sequences(counts: list[int], max_len: int, full: bool):
    """Every ordered list of (bucket, degree) stages that fits the bucket counts."""

    def walk(left: list[int], prefix: list[tuple[int, int]]):
        if prefix and (not full or not any(left)):
            yield list(prefix)
        if len(prefix) == max_len:
            return
        for k, count in enumerate(left):
            for t in TP_DEGREES:
                if t <= count:
                    left[k] -= t
                    yield from walk(left, prefix + [(k, t)])
                    left[k] += t

    yield from walk(list(counts), [])


def brute_force(dp: PipelineDP, devs, rule: str, num_stages: int = 0) -> float:
    cluster, model, tokens = dp.cluster, dp.model, WORKLOAD.s_in_max + WORKLOAD.s_out
    buckets = buckets_of(cluster, devs)
    memory = [cluster.devices[bk[0]].memory_bytes for bk in buckets]
    total_memory = sum(m * len(bk) for m, bk in zip(memory, buckets, strict=True))
    best = math.inf
    max_len = num_stages if rule == "even" else sum(len(b) for b in buckets)
    for seq in sequences([len(b) for b in buckets], max_len, full=rule == "proportional"):
        if rule == "even" and len(seq) != num_stages:
            continue
        taken, used, stages = [0] * len(buckets), 0.0, []
        for j, (k, t) in enumerate(seq):
            if rule == "even":
                start, end = (
                    round(j * model.num_layers / num_stages),
                    round((j + 1) * model.num_layers / num_stages),
                )
            else:
                start = round(model.num_layers * used / total_memory)
                used += t * memory[k]
                end = round(model.num_layers * used / total_memory)
            stages.append(StageLayout(buckets[k][taken[k] : taken[k] + t], start, end))
            taken[k] += t
        fits = all(
            stage_memory(model, len(s.devices), s.layers, tokens)
            <= min(cluster.devices[d].memory_bytes for d in s.devices)
            for s in stages
        )
        if not fits:
            continue
        best = min(best, dp.evaluate([s for s in stages if s.layers > 0]).latency_s)
    return best


@pytest.mark.parametrize("model_name", ["Llama-2-7B", "OPT-30B"])
def test_dp_matches_brute_force_proportional(model_name):
    cluster = small_cluster()
    dp = PipelineDP(cluster, preset(model_name), WORKLOAD)
    devs = list(range(len(cluster)))
    cost, stages = dp.dp_path(devs, "proportional")
    expected = brute_force(dp, devs, "proportional")
    assert cost == pytest.approx(expected, rel=1e-9)
    assert dp.evaluate(stages).latency_s == pytest.approx(cost, rel=1e-9)


@pytest.mark.parametrize("num_stages", [1, 2, 3])
def test_dp_matches_brute_force_even(num_stages):
    cluster = small_cluster()
    dp = PipelineDP(cluster, preset("Llama-2-7B"), WORKLOAD)
    devs = list(range(len(cluster)))
    cost, _ = dp.dp_path(devs, "even", num_stages)
    assert cost == pytest.approx(brute_force(dp, devs, "even", num_stages), rel=1e-9)


def test_even_split_infeasible_is_infinite():
    cluster = small_cluster()
    dp = PipelineDP(cluster, preset("OPT-30B"), WORKLOAD)
    cost, stages = dp.dp_path([6], "even", 1)  # one RTX 3090 cannot hold OPT-30B
    assert cost == math.inf and stages == []
    assert dp.layout([6]) is None


def test_layout_is_no_worse_than_dp_and_fits_memory():
    cluster = small_cluster()
    model = preset("OPT-30B")
    dp = PipelineDP(cluster, model, WORKLOAD)
    devs = list(range(len(cluster)))
    layout = dp.layout(devs)
    assert layout is not None
    assert layout.latency_s <= dp.dp_path(devs, "proportional")[0] + 1e-12
    assert [s.start for s in layout.stages][0] == 0 and layout.stages[-1].end == model.num_layers
    tokens = WORKLOAD.s_in_max + WORKLOAD.s_out
    for stage in layout.stages:
        need = stage_memory(model, len(stage.devices), stage.layers, tokens)
        assert all(cluster.devices[d].memory_bytes >= need for d in stage.devices)
        assert len({cluster.devices[d].machine for d in stage.devices}) == 1  # TP stays on one machine


def test_norway_needs_the_memory_proportional_split():
    cluster = scenario("heterogeneous-half-price")
    norway = [i for i, d in enumerate(cluster.devices) if d.region == "norway"]
    dp = PipelineDP(cluster, preset("Llama-2-70B"), WORKLOAD)
    for s in range(1, 5):
        assert dp.dp_path(norway, "even", s)[0] == math.inf  # 20+ layers on one 24 GiB GPU: OOM
    layout = dp.layout(norway)
    assert layout is not None and len(layout.devices) == 6
    assert sorted(len(s.devices) for s in layout.stages) == [1, 1, 2, 2]  # Table 4's [2, 1, 1, 2] shape


def test_symmetric_layouts_share_degree_and_layer_counts():
    cluster = scenario("heterogeneous-half-price")
    dp = SymmetricDP(cluster, preset("Llama-2-70B"), WORKLOAD)
    iceland = [i for i, d in enumerate(cluster.devices) if d.machine == "iceland-0"]
    layout = dp.layout(iceland)
    assert layout is not None
    assert len({len(s.devices) for s in layout.stages}) == 1
    assert max(s.layers for s in layout.stages) - min(s.layers for s in layout.stages) <= 1
