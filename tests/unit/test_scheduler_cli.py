"""`hexswarm plan` through the real dispatcher (swarm.commands.cli.main)."""

from __future__ import annotations

import json

import pytest

from hexswarm.routing.scheduler.plan import Plan
from hexswarm.swarm.commands.cli import main


def write_cluster(tmp_path, devices, name="cluster.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"devices": devices}))
    return str(path)


def a6000s(n, machine="m1"):
    return [{"id": f"{machine}-g{i}", "type": "A6000", "machine": machine, "region": "r"} for i in range(n)]


def test_plan_prints_json(tmp_path, capsys):
    cluster = write_cluster(tmp_path, a6000s(4) + a6000s(4, "m2"))
    argv = [
        "plan",
        "--cluster",
        cluster,
        "--model",
        "Llama-2-70B",
        "--budget-s",
        "2",
        "--json",
        "--rate",
        "0.5",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    plan = Plan.from_json(out)
    assert plan.model == "Llama-2-70B" and plan.num_layers == 80 and len(plan.pipelines) >= 1
    assert "planning" in err and "generation" in err and "pipelined-batched" in err
    estimate = json.loads(out)["estimate"]
    assert estimate["serving"] == "pipelined-batched" and estimate["max_batch"] == 16
    assert 0 < estimate["bound_ratio"] <= 1 and estimate["upper_bound_tok_s"] > 0


def test_plan_table_shows_the_serving_model_and_bound_ratio(tmp_path, capsys):
    cluster = write_cluster(tmp_path, a6000s(4) + a6000s(4, "m2"))
    argv = ["plan", "--cluster", cluster, "--model", "Llama-2-70B", "--budget-s", "2", "--rate", "0.5"]
    assert main(argv + ["--serving", "sequential"]) == 0
    out, _ = capsys.readouterr()
    assert "estimate (sequential, max batch 1)" in out and "of the upper bound" in out


def test_plan_prints_a_table_for_a_model_directory(tmp_path, capsys):
    model_dir = tmp_path / "tiny-llama"
    model_dir.mkdir()
    config = {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "torch_dtype": "float32",
        "vocab_size": 100,
    }
    (model_dir / "config.json").write_text(json.dumps(config))
    cluster = write_cluster(tmp_path, [{"id": "cpu0", "type": "CPU", "machine": "h", "region": "r"}])
    assert main(["plan", "--cluster", cluster, "--model", str(model_dir), "--budget-s", "1"]) == 0
    out, _ = capsys.readouterr()
    assert "plan for tiny-llama" in out and "layers     [0, 4)  tp=1  cpu0" in out


@pytest.mark.parametrize(
    "devices, model, message",
    [
        ([{"id": "x", "type": "GTX480"}], "Llama-2-7B", "unknown GPU type"),
        ([{"id": "x", "type": "T4"}], "Llama-2-70B", "less than"),
        ([{"id": "x", "type": "T4"}], "No-Such-Model", "a checkpoint folder or a preset (Llama-2-70B"),
    ],
)
def test_errors_are_one_line_without_traceback(tmp_path, capsys, devices, model, message):
    cluster = write_cluster(tmp_path, devices)
    assert main(["plan", "--cluster", cluster, "--model", model, "--budget-s", "1"]) == 2
    _, err = capsys.readouterr()
    assert message in err and "Traceback" not in err


def test_malformed_and_missing_files(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"devices": ')
    assert main(["plan", "--cluster", str(bad), "--model", "Llama-2-7B"]) == 2
    assert main(["plan", "--cluster", str(tmp_path / "missing.json"), "--model", "Llama-2-7B"]) == 2
    _, err = capsys.readouterr()
    assert "not valid JSON" in err and "missing.json" in err and "Traceback" not in err


def test_plan_for_throughput_has_no_deadline(tmp_path, capsys):
    cluster = write_cluster(tmp_path, a6000s(4) + a6000s(4, "m2"))
    argv = [
        "plan",
        "--cluster",
        cluster,
        "--model",
        "Llama-2-70B",
        "--budget-s",
        "2",
        "--objective",
        "throughput",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "no deadline" in out and "of the upper bound" in out and "within the SLO" not in out
    assert "for throughput" in err and "req/s" in err
    assert main(argv + ["--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)["estimate"]
    assert estimate["objective"] == "throughput" and estimate["slo_s"] is None and estimate["bound_ratio"] > 0


def test_evaluate_scores_a_searched_plan_as_the_search_did(tmp_path, capsys):
    cluster = write_cluster(tmp_path, a6000s(4) + a6000s(4, "m2"))
    argv = ["plan", "--cluster", cluster, "--model", "Llama-2-70B", "--rate", "0.5", "--json"]
    assert main([*argv, "--budget-s", "2"]) == 0
    searched = tmp_path / "searched.json"
    searched.write_text(capsys.readouterr().out)
    assert main([*argv, "--evaluate", str(searched)]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(searched.read_text())  # same shape, same figures


def test_evaluate_scores_a_plan_written_by_hand(tmp_path, capsys):
    cluster = write_cluster(tmp_path, a6000s(4) + a6000s(4, "m2"))
    stages = [
        {"device_ids": [f"m1-g{i}" for i in range(4)], "start": 0, "end": 40},
        {"device_ids": [f"m2-g{i}" for i in range(4)], "start": 40, "end": 80},
    ]
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"pipelines": [{"stages": stages}]}))
    argv = ["plan", "--cluster", cluster, "--model", "Llama-2-70B", "--rate", "0.5", "--evaluate", str(mine)]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["model"] == "Llama-2-70B" and plan["pipelines"][0]["latency_s"] > 0
    estimate = plan["estimate"]
    assert (
        0 < estimate["attainment"] <= 1
        and estimate["throughput_tok_s"] > 0
        and 0 < estimate["bound_ratio"] <= 1
    )
    assert main(argv) == 0
    assert "strategy [4, 4]" in capsys.readouterr().out


@pytest.mark.parametrize(
    "stages, message",
    [
        ([{"device_ids": ["m1-g0"], "start": 0, "end": 80}], "does not fit in memory: m1-g0"),
        ([{"device_ids": ["elsewhere"], "start": 0, "end": 80}], "not in the cluster: elsewhere"),
        ([{"device_ids": ["m1-g0"], "start": 0, "end": 70}], "covers layers [0, 70), not [0, 80)"),
    ],
)
def test_evaluate_refuses_a_plan_that_does_not_fit_in_one_line(tmp_path, capsys, stages, message):
    cluster = write_cluster(tmp_path, a6000s(4))
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"pipelines": [{"stages": stages}]}))
    assert main(["plan", "--cluster", cluster, "--model", "Llama-2-70B", "--evaluate", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
