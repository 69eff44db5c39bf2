"""Plan records (JSON and msgpack round trips, validation) and cluster-file parsing."""

from __future__ import annotations

import msgpack
import pytest

from hexswarm.routing.baselines.table4 import table4_plan
from hexswarm.routing.scenarios.hexgen_clusters import scenario
from hexswarm.routing.scheduler.cluster import Cluster, ClusterError
from hexswarm.routing.scheduler.model_spec import ModelSpec, preset
from hexswarm.routing.scheduler.plan import (
    SCHEMA_VERSION,
    PipelinePlan,
    Plan,
    PlanError,
    PlanEstimate,
    StagePlan,
)


def sample_plan() -> Plan:
    stages = (StagePlan(("a", "b"), 0, 50), StagePlan(("c",), 50, 80))
    estimate = PlanEstimate(0.93, 1.8, 2.25, 3.66, 2.0, 128, 32)
    return Plan("Llama-2-70B", 80, (PipelinePlan(stages, 2.5, 0.25, 2.25),), estimate)


def test_json_round_trip():
    plan = sample_plan()
    assert Plan.from_json(plan.to_json()) == plan
    assert plan.to_dict()["schema_version"] == SCHEMA_VERSION
    assert plan.pipelines[0].strategy == [2, 1]


def test_msgpack_round_trip():
    plan = table4_plan(scenario("heterogeneous-full-price"), preset("Llama-2-70B"))
    assert Plan.from_dict(msgpack.unpackb(msgpack.packb(plan.to_dict()))) == plan
    assert Plan.from_dict(msgpack.unpackb(msgpack.packb(sample_plan().to_dict()))) == sample_plan()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema_version=99), "schema_version"),
        (lambda d: d["pipelines"][0]["stages"][1].update(start=40), "consecutive"),
        (lambda d: d["pipelines"][0]["stages"][1].update(end=70), "covers"),
        (lambda d: d["pipelines"][0]["stages"][1].update(device_ids=["a"], tp_degree=1), "twice"),
        (lambda d: d["pipelines"][0]["stages"][0].update(tp_degree=4), "tp_degree"),
        (lambda d: d.update(pipelines="x"), "list"),
    ],
)
def test_invalid_plans_are_rejected(mutate, message):
    raw = sample_plan().to_dict()
    mutate(raw)
    with pytest.raises(PlanError, match=message):
        Plan.from_dict(raw)


def test_a_throughput_plan_has_no_deadline_and_round_trips():
    plan = sample_plan()
    raw = plan.to_dict()
    raw["estimate"].update(objective="throughput", slo_s=None)
    read = Plan.from_dict(msgpack.unpackb(msgpack.packb(raw)))
    assert read.estimate.objective == "throughput" and read.estimate.slo_s == float("inf")
    assert Plan.from_json(read.to_json()) == read and '"slo_s": null' in read.to_json()
    raw["estimate"]["objective"] = "fastest"
    with pytest.raises(PlanError, match="objective"):
        Plan.from_dict(raw)


def test_bad_json_is_a_plan_error():
    with pytest.raises(PlanError):
        Plan.from_json("{")


def test_cluster_file_expands_link_classes_and_overrides():
    cluster = Cluster.from_dict(
        {
            "devices": [
                {"id": "x0", "type": "rtx 3090 ti", "machine": "m", "region": "iceland"},
                {"id": "x1", "type": "RTX3090TI", "machine": "m", "region": "iceland"},
                {"id": "y0", "type": "A6000", "machine": "n", "region": "illinois", "memory_gb": 40},
                {"id": "z0", "type": "Custom", "memory_gb": 8, "memory_bandwidth_gbps": 50, "tflops": 1},
            ],
            "network": {
                "same_machine": {"latency_ms": 0.02, "bandwidth_gbps": 100},
                "overrides": [{"regions": ["illinois", "iceland"], "latency_ms": 110, "bandwidth_gbps": 0.5}],
            },
        }
    )
    assert cluster.latency[0, 1] == pytest.approx(2e-5)
    assert cluster.bandwidth[0, 1] == pytest.approx(100e9 / 8)
    assert cluster.latency[0, 2] == pytest.approx(0.110)
    assert cluster.bandwidth[2, 0] == pytest.approx(0.5e9 / 8)
    assert cluster.devices[2].memory_bytes == 40 * 2**30
    assert cluster.devices[3].flops == 1e12
    assert cluster.latency[2, 3] == pytest.approx(0.1)  # default cross-region


@pytest.mark.parametrize(
    "raw, message",
    [
        ({}, "devices"),
        ({"devices": []}, "devices"),
        ({"devices": [{"id": "a", "type": "GTX480"}]}, "unknown GPU type"),
        ({"devices": [{"id": "a"}]}, "type"),
        ({"devices": [{"id": "a", "type": "T4"}, {"id": "a", "type": "T4"}]}, "unique"),
        ({"devices": [{"id": "a", "type": "T4", "memory_gb": -1}]}, "memory_gb"),
        (
            {"devices": [{"id": "a", "type": "T4"}], "network": {"same_region": {"latency_ms": 1}}},
            "bandwidth",
        ),
        ({"devices": [{"id": "a", "type": "T4"}], "network": {"overrides": [{"regions": ["a"]}]}}, "regions"),
    ],
)
def test_malformed_cluster_files(raw, message):
    with pytest.raises(ClusterError, match=message):
        Cluster.from_dict(raw)


def test_model_from_hf_config():
    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "torch_dtype": "bfloat16",
        "vocab_size": 1000,
    }
    model = ModelSpec.from_hf_config(config, "tiny")
    assert model.dtype_bytes == 2 and model.kv_width == 32
    assert model.params_per_layer == 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
    with pytest.raises(ValueError):
        ModelSpec.from_hf_config({"hidden_size": 4})
