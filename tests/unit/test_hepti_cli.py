"""`hexswarm plan --hepti GROUP.json` through the real dispatcher (swarm.commands.cli.main)."""

from __future__ import annotations

import json

import pytest

from hexswarm.swarm.commands.cli import main

LLAMA_8B = {
    "hidden_size": 4096,
    "num_heads": 32,
    "num_kv_heads": 8,
    "head_dim": 128,
    "intermediate_size": 14336,
}


def group_file(tmp_path, desktop_free=4e9, others_free=(3e9, 2e9), **extra):
    raw = {
        "shape": LLAMA_8B,
        "layers": 8,
        "tokens": 8,
        "devices": [
            {"name": "desktop", "flops": 4e11, "free_bytes": desktop_free},
            {
                "name": "laptop",
                "flops": 2e11,
                "free_bytes": others_free[0],
                "bandwidth": 1.25e9,
                "latency_s": 2e-5,
            },
            {
                "name": "mini-pc",
                "flops": 1e11,
                "free_bytes": others_free[1],
                "bandwidth": 1.25e8,
                "latency_s": 2e-4,
            },
        ],
        **extra,
    }
    path = tmp_path / "group.json"
    path.write_text(json.dumps(raw))
    return str(path)


def test_the_table_shows_each_rank_the_mode_and_the_predicted_step(tmp_path, capsys):
    assert main(["plan", "--hepti", group_file(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "mode weight-stationary" in lines[0] and "8 layers" in lines[0]
    rows = {line.split()[0]: line.split() for line in lines[2:5]}
    assert set(rows) == {"desktop", "laptop", "mini-pc"}
    assert int(rows["desktop"][1]) > int(rows["laptop"][1])  # twice as fast: more heads
    assert lines[-1].startswith("predicted step") and "ms" in lines[-1]


def test_json_is_the_split_record_and_memory_picks_a_tiled_mode(tmp_path, capsys):
    assert main(["plan", "--hepti", group_file(tmp_path, desktop_free=1.2e9), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["mode"] == "1d-tiled" and record["schema_version"] == 1
    shares = record["shares"]
    assert sum(s["heads"] for s in shares) == 32 and all(s["heads"] % 4 == 0 for s in shares)
    assert sum(s["mlp_columns"] for s in shares) == 14336
    assert all(s["weight_bytes"] <= s["free_bytes"] for s in shares)


def test_a_built_in_model_gives_the_shape(tmp_path, capsys):
    path = group_file(tmp_path, model="smollm2-135m")
    raw = json.loads((tmp_path / "group.json").read_text())
    del raw["shape"]
    (tmp_path / "group.json").write_text(json.dumps(raw))
    assert main(["plan", "--hepti", path, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["layers"] == 8 and sum(s["heads"] for s in record["shares"]) == 9
    assert sum(s["mlp_columns"] for s in record["shares"]) == 1536


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hepti", "GROUP"], "of weights; the 3 devices have"),  # nothing fits: before anything loads
        (["--cluster", "c.json"], "required: --model"),
        (["--hepti", "missing.json"], "No such file"),
    ],
)
def test_errors_exit_2_with_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    argv = [group_file(tmp_path, 1e8, (1e9, 1e9)) if a == "GROUP" else a for a in argv]
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
