"""The commands a newcomer runs first: bootstrap, status and the demo."""

import os
import signal
import subprocess
import sys

import pytest

from hexswarm.swarm.tools.launcher import LocalSwarm

pytestmark = pytest.mark.integration


def test_bootstrap_keeps_its_peer_id_across_restarts(tmp_path):
    with LocalSwarm(tmp_path) as local:  # the identity file lives in tmp_path
        first = local.start_bootstrap()[0]
        assert first.startswith("/ip4/127.0.0.1/tcp/") and "/p2p/" in first
        local.close()
        again = local.start_bootstrap()[0]
    assert again.split("/p2p/")[1] == first.split("/p2p/")[1]


def test_status_exits_nonzero_when_blocks_are_missing(swarm, make_model):
    unserved = make_model(arch="llama", seed=11)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hexswarm.swarm.commands.cli",
            "status",
            "--initial-peers",
            *swarm.initial_peers,
            "--model",
            str(unserved),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "MISSING: blocks 0:6 have no online peer" in result.stdout


@pytest.mark.parametrize("flags", [(), ("--tiny",)], ids=["smollm2", "tiny"])
def test_demo_generates_and_leaves_nothing_running(tmp_path, flags):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hexswarm.swarm.commands.cli",
            "demo",
            "--max-new-tokens",
            "16",
            "--workdir",
            str(tmp_path),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "chain: alice[" in result.stdout and "tokens/s" in result.stdout
    if not flags:  # the real model answers, and no library warning reaches the user
        assert (
            "output: ' Paris." in result.stdout
            and "output: 'The capital of France is Paris." in result.stdout
        )
        assert "warn" not in (result.stdout + result.stderr).lower(), result.stdout + result.stderr
    for log in (tmp_path / "logs").glob("*.log"):
        pid_lines = [line for line in log.read_text(errors="replace").splitlines() if "stopped" in line]
        assert log.name == "bootstrap.log" or pid_lines, f"{log.name} did not stop cleanly"
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    for pid in leftovers:  # never leave anything behind, even when the assertion below fails
        os.kill(int(pid), signal.SIGKILL)
    assert not leftovers
