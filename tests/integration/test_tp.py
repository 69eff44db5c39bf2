"""Tensor-parallel peers (`run-peer --tp 2`, gloo on CPU) in real multi-process swarms.

One swarm for the module: a Llama chain that mixes degrees (TP 2 [0, 4), TP 1 [4, 6),
TP 2 [6, 8)) and a Qwen2 chain with GQA (4 heads, 2 KV heads, so one KV head per rank;
biases; sharded checkpoint) that does too. Every process is stopped by the fixture.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.records import read_peer_records
from hexswarm.swarm.wire.protocol import ErrorCode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LLAMA_PEERS = {"tp-a": ("0:4", 2), "tp-b": ("4:6", 1), "tp-c": ("6:8", 2)}
QWEN_PEERS = {"qw-a": ("0:2", 2), "qw-b": ("2:4", 1)}
SHAPE = dict(hidden=128, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def tp_swarm(make_model, tmp_path_factory):
    """The two chains, plus "victim" (TP 2, a model of its own) for the rank-failure test."""
    models = {
        "llama": make_model(arch="llama", layers=8, **SHAPE),
        "qwen2": make_model(arch="qwen2", layers=4, max_shard_size="300KB", **SHAPE),
        "victim": make_model(arch="llama", layers=2, seed=9, **SHAPE),
    }
    peers = [
        *((models["llama"], name, layers, tp) for name, (layers, tp) in LLAMA_PEERS.items()),
        *((models["qwen2"], name, layers, tp) for name, (layers, tp) in QWEN_PEERS.items()),
        (models["victim"], "victim", "0:2", 2),
    ]
    with LocalSwarm(tmp_path_factory.mktemp("tp-swarm")) as local:
        local.start_bootstrap()
        procs = [
            local.start_peer(model_dir, layers, name, "--tp", str(tp), "--announce-period", "1",
                             "--tp-timeout", "10", wait=False)
            for model_dir, name, layers, tp in peers
        ]  # fmt: skip
        for proc in procs:
            local.wait_for_log(proc, "online:", timeout=180)
        yield local, {name: Path(path) for name, path in models.items()}
        for proc in local.processes:  # all leave at once, not one after another
            if proc.alive():
                proc.popen.send_signal(signal.SIGTERM)


def _client(local: LocalSwarm, model_dir: Path, **kwargs):
    from hexswarm.client import DistributedModelForCausalLM

    return DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=local.initial_peers, **kwargs)


@pytest.mark.parametrize("arch, names", [("llama", LLAMA_PEERS), ("qwen2", QWEN_PEERS)])
def test_mixed_degree_chain_equals_local(tp_swarm, arch, names):
    """Greedy tokens equal the local model's; logits match it (= TP 1) within float tolerance."""
    local, models = tp_swarm
    reference = AutoModelForCausalLM.from_pretrained(models[arch])
    model = _client(local, models[arch])
    try:
        input_ids = torch.randint(3, 400, (2, 7), generator=torch.Generator().manual_seed(6))
        expected = reference.generate(input_ids, max_new_tokens=12, do_sample=False)
        assert torch.equal(model.generate(input_ids, max_new_tokens=12, do_sample=False), expected)
        assert all(f"{name}[" in model.last_route for name in names), model.last_route
        # speculative passes: every rank rolls its share of the cache back past rejected drafts
        prompt = input_ids[:1, :4].repeat(1, 3)
        expected = reference.generate(prompt, max_new_tokens=12, do_sample=False)
        got = model.generate(prompt, max_new_tokens=12, do_sample=False, prompt_lookup_num_tokens=4)
        assert torch.equal(got, expected) and model.drafts.kept < model.drafts.drafted
        with torch.no_grad():
            torch.testing.assert_close(
                model(input_ids).logits, reference(input_ids).logits, atol=1e-4, rtol=1e-4
            )
    finally:
        model.shutdown()


def test_record_shows_tp_and_devices(tp_swarm):
    local, models = tp_swarm
    model = _client(local, models["llama"])
    try:
        records = {r.name: r for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
    finally:
        model.shutdown()
    for name, (_, tp) in LLAMA_PEERS.items():
        record = records[name]
        assert record.tp == tp and len(record.devices) == tp
        assert all(d.type == "cpu" and d.memory_bytes > 0 and d.cores >= 1 for d in record.devices)
        assert record.throughput > 0 and record.decode_ms_per_block > 0  # measured through the group
    assert records["tp-a"].device == "cpu,cpu"


UNREACHABLE = ("--initial-peers", "/ip4/127.0.0.1/tcp/9/p2p/QmUnreachable")  # never contacted


def test_bad_degree_exits_2_before_loading(make_model):
    model_dir = make_model(arch="llama", layers=8, **SHAPE)
    result = subprocess.run(
        [sys.executable, "-m", "hexswarm.peer.cli", str(model_dir), "--layers", "0:2", "--tp", "3", *UNREACHABLE],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--tp 3 does not divide the model's 4 attention heads" in result.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--tp", "2", "--devices", "cuda:0,cuda:0"), "cuda:0 is given twice"),
        (("--tp", "2", "--devices", "cpu"), "--tp 2 needs 2 devices, but --devices names 1"),
        (("--tp", "2", "--devices", "cuda:0,cuda:9"), "is missing: this machine has"),
    ],
)  # more bad lists in tests/unit/test_tp_shard.py
def test_bad_devices_exit_2_before_loading(make_model, capsys, flags, message):
    """The same `main` as the subprocess above, in this process: it returns before any I/O."""
    from hexswarm.peer.cli import main

    model_dir = make_model(arch="llama", layers=8, **SHAPE)
    assert main([str(model_dir), "--layers", "0:2", *flags, *UNREACHABLE]) == 2
    assert message in capsys.readouterr().err


def test_killed_rank_fails_the_peer_and_stops_the_group(tp_swarm):
    """SIGKILL to rank 1 while a session is open: the client hears PEER_FAILED, the leader
    exits non-zero, and nothing of the group keeps running."""
    from hexswarm.client import PeerError, RetryPolicy

    local, models = tp_swarm
    victim = next(p for p in local.processes if p.name == "victim")
    # No other peer serves the victim's model: the failover gives up when its budget is spent.
    client = _client(local, models["victim"], retry=RetryPolicy(retry_budget_s=3))
    try:
        with pytest.raises(PeerError) as failure:
            with client.inference_session(max_length=8):
                client(torch.tensor([[5, 6, 7]]))
                rank_pid = int(re.search(r"tensor-parallel rank 1: pid (\d+)", victim.log()).group(1))
                os.kill(rank_pid, signal.SIGKILL)
                client(torch.tensor([[8]]))
        assert failure.value.code == ErrorCode.PEER_FAILED, failure.value
        assert victim.popen.wait(timeout=60) != 0
        deadline = time.monotonic() + 20
        while _live_group_members(victim.popen.pid):
            assert time.monotonic() < deadline, f"left running: {_live_group_members(victim.popen.pid)}"
            time.sleep(0.2)
        assert "killed by SIGKILL" in victim.log()
    finally:
        client.shutdown()


@pytest.mark.parametrize("name, how", [("tp-c", "SIGTERM to the leader"), ("qw-a", "Ctrl-C to the group")])
def test_signal_stops_the_whole_group(tp_swarm, name, how):
    """Runs last: stops a TP 2 peer of the module's swarm. It leaves cleanly (status 0), its
    ranks included; Ctrl-C reaches every process of the group, as in a terminal."""
    local, _ = tp_swarm
    proc = next(p for p in local.processes if p.name == name)
    if how.startswith("SIGTERM"):
        proc.popen.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.popen.pid, signal.SIGINT)
    assert proc.popen.wait(timeout=60) == 0, proc.log()[-2000:]
    deadline = time.monotonic() + 20
    while _live_group_members(proc.popen.pid):
        assert time.monotonic() < deadline, f"left running: {_live_group_members(proc.popen.pid)}"
        time.sleep(0.2)


def _live_group_members(pgid: int) -> list[int]:
    """Pids of processes (not zombies) in process group `pgid`."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            members.append(int(stat.parent.name))
    return members
