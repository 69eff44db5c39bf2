"""Quantized devices in the scheduler's memory model (HexGen Eq. 4 and 7 at a format's bytes per
weight), in `hexswarm plan --quant` and in the coordinator's view of peer records."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from hexswarm.routing.scheduler.cluster import Cluster, Device, Network, build_cluster
from hexswarm.routing.scheduler.cost_model import (
    StageSpec,
    comp_cost,
    device_layer_bytes,
    max_layers,
    pipeline_fits,
    stage_layer_bytes,
    stage_memory,
    stage_quant,
    weight_memory,
)
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP
from hexswarm.routing.scheduler.plan import PipelinePlan, Plan, PlanError, StagePlan
from hexswarm.routing.scheduler.search.genetic import SearchConfig
from hexswarm.routing.scheduler.search.pinned_stages import free_devices, pinned_pipelines
from hexswarm.routing.scheduler.weight_formats import bytes_per_weight
from hexswarm.swarm.commands.cli import main
from hexswarm.swarm.coordinator.cluster_view import build_view
from hexswarm.swarm.coordinator.moves import kind_of
from hexswarm.swarm.coordinator.planner import compute_plan
from tests.unit.record_cases import make_record

TINY = ModelSpec("tiny", 8, 128, 4)  # float32: 786 KB of weights a layer, 197 KB at int8
WORKLOAD = Workload(slo_scale=100)
TOKENS = WORKLOAD.s_in_max + WORKLOAD.s_out
SMALL_MEMORY = 3.6e6  # bytes: 3 of TINY's layers at "none" (with their KV cache), 7 at int8


def device(name: str, quant: str = "none", memory: float = SMALL_MEMORY) -> Device:
    return Device(name, "edge", f"m-{name}", "r", memory, 100e9, 1e12, quant)


def cluster_of(*devices: Device) -> Cluster:
    return build_cluster(list(devices), Network())


# The memory model ------------------------------------------------------------------------------


def test_max_layers_grows_about_4x_from_float32_to_int8_for_the_weights_share():
    model = ModelSpec("f32", 32, 1024, dtype_bytes=4)
    int8 = model.layer_weight_bytes("int8")
    assert int8 == model.params_per_layer * bytes_per_weight("int8", 4)
    memory = 100 * 2**30
    ratio = max_layers(model, 1, memory, 0, layer_bytes=int8) / max_layers(model, 1, memory, 0)
    assert ratio == pytest.approx(4 / (1 + 2 / 512), rel=1e-3)  # weights alone: ~4x
    # The KV cache and activations stay in the compute dtype: what tokens add is the same.
    for layer_bytes in (None, int8):
        kv = stage_memory(model, 2, 5, TOKENS, 3, layer_bytes) - stage_memory(model, 2, 5, 0, 3, layer_bytes)
        assert kv == stage_memory(model, 2, 5, TOKENS, 3) - stage_memory(model, 2, 5, 0, 3)
    with_kv = max_layers(model, 1, memory, TOKENS, 16, int8) / max_layers(model, 1, memory, TOKENS, 16)
    assert 1 < with_kv < ratio


def test_none_is_the_compute_dtype_exactly():
    d = device("a")
    assert TINY.layer_weight_bytes("none") == TINY.layer_bytes == device_layer_bytes(d, TINY)
    assert weight_memory(d, TINY) == d.memory_bytes
    assert max_layers(TINY, 1, SMALL_MEMORY, TOKENS, 1, TINY.layer_bytes) == max_layers(
        TINY, 1, SMALL_MEMORY, TOKENS
    )


def test_the_decode_scan_reads_the_quantized_bytes():
    cluster = cluster_of(device("a"), device("b", "int8"), device("c", "nf4"))
    prefill = [comp_cost(cluster, [i], TINY, 4, 128.0, 32).prefill for i in range(3)]
    decode = [comp_cost(cluster, [i], TINY, 4, 0.0, 32).decode for i in range(3)]
    assert prefill[0] == prefill[1] == prefill[2]  # FLOPs do not change
    assert decode[0] > decode[1] > decode[2]
    flops = 2.0 * TINY.params_per_layer * 32 / 1e12 * 4
    scan = [t - flops for t in decode]
    assert scan[1] / scan[0] == pytest.approx(TINY.layer_weight_bytes("int8") / TINY.layer_bytes)


def test_a_stage_of_mixed_formats_is_counted_at_the_largest_bytes_per_weight():
    cluster = cluster_of(device("a"), device("b", "int8"), device("c", "nf4"))
    assert (
        stage_quant(cluster, [1, 0], TINY) == "none"
        and stage_layer_bytes(cluster, [1, 0], TINY) == TINY.layer_bytes
    )
    assert stage_quant(cluster, [2, 1], TINY) == "int8"
    assert stage_layer_bytes(cluster, [2, 1], TINY) == TINY.layer_weight_bytes("int8")
    assert (
        comp_cost(cluster, [0, 1], TINY, 1, 0.0, 1).decode
        == comp_cost(cluster_of(device("a"), device("b")), [0, 1], TINY, 1, 0.0, 1).decode
    )


def test_an_int8_device_is_planned_more_layers_than_the_same_device_at_none():
    assert max_layers(TINY, 1, SMALL_MEMORY, TOKENS) == 3
    assert max_layers(TINY, 1, SMALL_MEMORY, TOKENS, 1, TINY.layer_weight_bytes("int8")) == 7
    mixed = cluster_of(device("a"), device("b", "int8"))
    layout = PipelineDP(mixed, TINY, WORKLOAD).layout([0, 1])
    assert layout is not None
    layers = {mixed.devices[s.devices[0]].id: s.layers for s in layout.stages}
    assert layers["b"] > 3 >= layers.get("a", 0)  # more than the device could hold at "none"
    stages = [StageSpec(s.devices, s.layers) for s in layout.stages]
    assert pipeline_fits(mixed, stages, TINY, TOKENS)
    assert not pipeline_fits(mixed.with_quant("none"), stages, TINY, TOKENS)
    # Two such devices at "none" cannot hold the 8 layers at all; at int8 either alone nearly can.
    assert PipelineDP(cluster_of(device("a"), device("b")), TINY, WORKLOAD).layout([0, 1]) is None


def test_with_quant_and_the_cluster_file_give_devices_their_format():
    raw = {"devices": [{"id": "a", "type": "A6000"}, {"id": "b", "type": "A6000", "quant": "nf4"}]}
    cluster = Cluster.from_dict(raw)
    assert [d.quant for d in cluster.devices] == ["none", "nf4"]
    assert {d.quant for d in cluster.with_quant("int8").devices} == {"int8"}
    assert [d.quant for d in cluster.devices] == ["none", "nf4"]  # the original is unchanged


def test_a_plan_names_each_stages_format_and_reads_old_plans_as_none():
    plan = Plan.from_dict(
        {"schema_version": 1, "model": "m", "num_layers": 8, "pipelines": [{"stages": [
            {"device_ids": ["a"], "start": 0, "end": 3},
            {"device_ids": ["b"], "start": 3, "end": 8, "quant": "int8"}]}]}
    )  # fmt: skip
    assert [s.quant for s in plan.pipelines[0].stages] == ["none", "int8"]
    assert Plan.from_json(plan.to_json()) == plan
    bad = plan.to_dict()
    bad["pipelines"][0]["stages"][1]["quant"] = "fp8"
    with pytest.raises(PlanError, match="the formats are none, int8, nf4"):
        Plan.from_dict(bad)


# hexswarm plan --quant -------------------------------------------------------------------------


@pytest.fixture
def tiny_model(tmp_path) -> str:
    """A float32 Llama of 8 layers (2.6 MB of weights a layer, 0.66 MB at int8)."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    config = {
        "model_type": "llama", "num_hidden_layers": 8, "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 4, "torch_dtype": "float32",
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def write_cluster(tmp_path, quant: str | None = None) -> str:
    """Four devices of 10 MB: 2 of the tiny model's layers each at "none", all 8 at int8."""
    devices = [
        {"id": f"d{i}", "type": "edge", "machine": f"m{i}", "region": "r", "memory_gb": 10e6 / 2**30,
         "memory_bandwidth_gbps": 100, "tflops": 1}
        for i in range(4)
    ]  # fmt: skip
    if quant is not None:
        devices[1]["quant"] = quant
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"devices": devices}))
    return str(path)


# Short requests served one at a time: the plan's capacity simulation stays short.
QUICK = ["--s-out", "4", "--serving", "sequential", "--seed", "1"]


def plan_json(capsys, argv: list[str]) -> dict:
    assert main(["plan", *argv, *QUICK, "--json", "--budget-s", "0.5"]) == 0
    return json.loads(capsys.readouterr().out)


def stages_of(plan: dict) -> list[dict]:
    return [s for p in plan["pipelines"] for s in p["stages"]]


def test_plan_quant_int8_gives_larger_stages_on_a_memory_bound_cluster(tmp_path, capsys, tiny_model):
    cluster = write_cluster(tmp_path)
    plain = plan_json(capsys, ["--cluster", cluster, "--model", tiny_model])
    cap = max(s["end"] - s["start"] for s in stages_of(plain))  # what one device holds at "none"
    assert cap < 8 and {s["quant"] for s in stages_of(plain)} == {"none"}
    int8 = plan_json(capsys, ["--cluster", cluster, "--model", tiny_model, "--quant", "int8"])
    assert max(s["end"] - s["start"] for s in stages_of(int8)) > cap
    fewest = min(len(p["stages"]) for p in plain["pipelines"])
    assert max(len(p["stages"]) for p in int8["pipelines"]) < fewest
    assert {s["quant"] for s in stages_of(int8)} == {"int8"}


def test_plan_evaluate_scores_at_the_quant_it_is_given(tmp_path, capsys, tiny_model):
    cluster = write_cluster(tmp_path)
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps({"pipelines": [{"stages": [{"device_ids": ["d0"], "start": 0, "end": 8}]}]}))
    argv = ["plan", "--cluster", cluster, "--model", tiny_model, *QUICK, "--evaluate", str(whole)]
    assert main(argv) == 2
    assert "does not fit in memory: d0" in capsys.readouterr().err
    assert main([*argv, "--quant", "int8", "--json"]) == 0
    assert stages_of(json.loads(capsys.readouterr().out))[0]["quant"] == "int8"
    assert main([*argv, "--quant", "int8"]) == 0
    assert "tp=1  int8  d0" in capsys.readouterr().out


def test_an_unknown_format_in_the_cluster_file_is_a_usage_error(tmp_path, capsys, tiny_model):
    cluster = write_cluster(tmp_path, quant="fp8")
    assert main(["plan", "--cluster", cluster, "--model", tiny_model]) == 2
    err = capsys.readouterr().err
    assert "devices[1] (d1): unknown weight format 'fp8'; the formats are none, int8, nf4" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


# The coordinator's view of peer records --------------------------------------------------------


def peer(quant: str = "none", **changes):
    return make_record(
        **{"max_blocks": 6, "throughput": 5000.0, "decode_ms_per_block": 0.4, "quant": quant, **changes}
    )


def test_an_int8_record_is_an_int8_device_whose_decode_is_the_measured_one():
    for record in (peer("int8"), peer("int8", weight_bytes_per_block=210_000), peer("none")):
        cluster = build_view([record], TINY, WORKLOAD)
        (d,) = cluster.devices
        assert d.quant == record.quant
        scan_s = stage_layer_bytes(cluster, [0], TINY) / d.bandwidth
        assert scan_s == pytest.approx(record.decode_ms_per_block / 1000)
        decode = comp_cost(cluster, [0], TINY, 1, 0.0, 1).decode
        assert decode == pytest.approx(record.decode_ms_per_block / 1000 + 1 / record.throughput)
        # max_blocks is counted at the peer's format: exactly that many of its blocks fit
        layer_bytes = stage_layer_bytes(cluster, [0], TINY)
        assert max_layers(TINY, 1, d.memory_bytes, TOKENS, 1, layer_bytes) == record.max_blocks
    stated = build_view([peer("int8", weight_bytes_per_block=210_000)], TINY, WORKLOAD).devices[0]
    assert device_layer_bytes(stated, TINY) == 210_000
    estimated = build_view([peer("int8")], TINY, WORKLOAD).devices[0]
    assert device_layer_bytes(estimated, TINY) == TINY.layer_weight_bytes("int8")


def test_peers_of_different_formats_are_not_one_kind():
    none, int8 = (build_view([peer(q)], TINY, WORKLOAD).devices[0] for q in ("none", "int8"))
    assert kind_of(none) != kind_of(int8)
    assert kind_of(int8) == kind_of(replace(int8, id="other"))


def test_a_fixed_quantized_peer_is_pinned_in_its_format_and_kept_in_one_pipeline():
    search = SearchConfig(max_generations=200, time_budget_s=math.inf, capacity=False)
    fixed = peer("int8", peer_id="fixed", start=0, end=4, max_blocks=4)
    records = [fixed] + [
        peer("int8", peer_id=f"p{i}", start=4, end=8, auto=True, max_blocks=4) for i in range(3)
    ]
    planned = compute_plan(records, TINY, WORKLOAD, search)
    stages = [s for p in planned.plan.pipelines for s in p.stages]
    assert [s.quant for s in stages if s.device_ids == ("fixed",)] == ["int8"]
    # A previous plan's pipeline through a pinned stage is kept, the stage matched by its devices
    # and range whatever format either names: it is not placed a second time.
    cluster = build_view(records, TINY, WORKLOAD)
    through = PipelinePlan((StagePlan(("fixed",), 0, 4, "int8"), StagePlan(("p0",), 4, 8, "int8")))
    previous = Plan("tiny", 8, (through,))
    for quant in ("none", "int8"):
        pinned = [StagePlan(("fixed",), 0, 4, quant)]
        free = free_devices(cluster, pinned, True)
        layouts, _ = pinned_pipelines(cluster, TINY, WORKLOAD, pinned, free, previous)
        holders = [lay for lay in layouts if cluster.index("fixed") in lay.devices]
        assert len(holders) == 1
