"""The error paths a new user meets first, through the real commands: a wrong or unreachable
--initial-peers, a mistyped flag, a reversed layer range. Each is one line and exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hexswarm.swarm.tools.launcher import free_port

pytestmark = pytest.mark.integration

# a well-formed address nobody listens at (port 9 is "discard", closed here)
UNREACHABLE = "/ip4/127.0.0.1/tcp/9/p2p/QmUMM67xgzV8V4puwGSHTmS7U3VxVutYhVZPYoexxBz82Q"
MALFORMED = "127.0.0.1:31337"


def _command(name: str, model) -> list[str]:
    if name == "run-peer":
        return [sys.executable, "-m", "hexswarm.peer.cli", str(model), "--layers", "0:2"]
    verb = [sys.executable, "-m", "hexswarm.swarm.commands.cli", name]
    return {
        "generate": [*verb, str(model), "--max-new-tokens", "2"],
        "status": verb,
        "api": [*verb, "--model", str(model), "--port", str(free_port())],
        "monitor": [*verb, "--port", str(free_port())],
        "coordinator": [*verb, "--model", str(model)],
    }[name]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def _one_line(result: subprocess.CompletedProcess) -> str:
    """The one line of the error (a command's INFO lines before it, like the coordinator's key, aside)."""
    lines = [
        line for line in (result.stdout + result.stderr).splitlines() if line.strip() and " INFO " not in line
    ]
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stdout, result.stderr)
    return lines[0]


@pytest.mark.parametrize("command", ["run-peer", "generate", "status", "api", "monitor", "coordinator"])
@pytest.mark.parametrize("address", ["malformed", "unreachable"])
def test_a_bad_initial_peer_is_one_line_and_exit_2(make_model, command, address):
    model = make_model(arch="llama", layers=2, seed=3)
    given = MALFORMED if address == "malformed" else UNREACHABLE
    line = _one_line(_run([*_command(command, model), "--initial-peers", given]))
    if address == "malformed":
        assert "is not a multiaddr" in line and "/p2p/" in line, line
    else:
        assert "none of the initial peers answered" in line and "127.0.0.1/tcp/9" in line, line


def test_a_mistyped_flag_is_named_with_its_closest_match(make_model):
    model = make_model(arch="llama", layers=2, seed=3)
    line = _one_line(_run([*_command("generate", model), "--inital-peers", UNREACHABLE]))
    assert "unrecognized argument --inital-peers: did you mean --initial-peers?" in line, line


def test_a_reversed_layer_range_is_told_so_before_the_model_loads(make_model):
    model = make_model(arch="llama", layers=2, seed=3)
    result = _run([*_command("run-peer", model)[:-2], "--layers", "2:0", "--initial-peers", UNREACHABLE])
    line = _one_line(result)
    assert "2:0 is an empty or reversed range" in line and "0:2" in line, line


def test_the_python_client_raises_one_typed_error(make_model):
    from hexswarm.client import DistributedModelForCausalLM, InitialPeersError

    model = make_model(arch="llama", layers=2, seed=3)
    for given in (MALFORMED, UNREACHABLE):
        with pytest.raises(InitialPeersError):
            DistributedModelForCausalLM.from_pretrained(model, initial_peers=[given])
