"""`hexswarm plan --disaggregated` through the real dispatcher (swarm.commands.cli.main)."""

from __future__ import annotations

import json

from hexswarm.routing.disaggregation.plan_record import DisaggregatedPlan
from hexswarm.swarm.commands.cli import main


def cluster_file(tmp_path):
    devices = [
        {"id": f"{machine}-g{i}", "type": gpu, "machine": machine, "region": "r"}
        for machine, gpu in (("m1", "A6000"), ("m2", "L40"))
        for i in range(2)
    ]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"devices": devices}))
    return str(path)


def plan_argv(tmp_path):
    # a search this small ends on its own, long before its budget
    return ["plan", "--cluster", cluster_file(tmp_path), "--model", "Llama-2-7B", "--budget-s", "10"]


def test_the_table_shows_roles_parallel_plans_flows_and_the_estimate(tmp_path, capsys):
    assert main(plan_argv(tmp_path) + ["--disaggregated", "--s-in", "512", "--s-out", "64"]) == 0
    out, err = capsys.readouterr()
    assert "prefill" in out and "decode" in out and "layers" in out and "tp=" in out
    assert "KV routes" in out and "req/s" in out
    estimate = out.strip().splitlines()[-1]
    assert estimate.startswith("estimate:") and "tokens/s" in estimate and "s_out 64" in estimate
    assert "prefill and decode apart" in err


def test_json_is_the_plan_record(tmp_path, capsys):
    assert main(plan_argv(tmp_path) + ["--disaggregated", "--json"]) == 0
    plan = DisaggregatedPlan.from_dict(json.loads(capsys.readouterr().out))
    assert plan.model == "Llama-2-7B" and {r.role for r in plan.replicas} == {"prefill", "decode"}
    assert plan.throughput_tok_s > 0
    assert all(abs(sum(row.values()) - 1) < 1e-9 for row in plan.dispatch().values())


def test_evaluate_does_not_combine_with_disaggregated(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    assert main(plan_argv(tmp_path) + ["--disaggregated", "--evaluate", str(plan)]) == 2
    err = capsys.readouterr().err
    assert "--disaggregated" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_evaluate_scores_a_disaggregated_plan_printed_by_json(tmp_path, capsys):
    assert main(plan_argv(tmp_path) + ["--disaggregated", "--json"]) == 0
    printed = capsys.readouterr().out
    searched = DisaggregatedPlan.from_dict(json.loads(printed))
    path = tmp_path / "disaggregated.json"
    path.write_text(printed)
    assert main(plan_argv(tmp_path) + ["--evaluate", str(path), "--json"]) == 0
    scored = DisaggregatedPlan.from_dict(json.loads(capsys.readouterr().out))
    assert [r.role for r in scored.replicas] == [r.role for r in searched.replicas]
    assert abs(scored.throughput_tok_s - searched.throughput_tok_s) <= 1e-6 * searched.throughput_tok_s
    assert main(plan_argv(tmp_path) + ["--evaluate", str(path)]) == 0  # and as a table
    assert "KV routes" in capsys.readouterr().out
