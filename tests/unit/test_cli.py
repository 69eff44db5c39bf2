"""One command-line: every command's --help (fast, every option explained, defaults shown),
--version, one-line usage errors with exit status 2, hidden test-only flags and renamed flags."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import pytest

from hexswarm.peer.cli import build_parser as run_peer_parser
from hexswarm.swarm import __version__
from hexswarm.swarm.commands.cli import SUBCOMMANDS, build_parser, main

UNREACHABLE = ["--initial-peers", "/ip4/127.0.0.1/tcp/9/p2p/QmUnreachable"]  # never contacted
HIDDEN = {
    "--debug-fail-after",
    "--debug-record",
    "--no-batching",
    "--max-batch",
    "--max-batch-tokens",
}


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, built in this process: run-peer and each hexswarm verb."""
    return {"run-peer": run_peer_parser(), **{f"hexswarm {verb}": build_parser(verb) for verb in SUBCOMMANDS}}


@pytest.mark.parametrize("name", ["run-peer", *(f"hexswarm {verb}" for verb in SUBCOMMANDS)])
def test_every_option_is_explained_and_test_only_flags_are_hidden(name, capsys):
    parser = parsers()[name]
    unexplained = [
        action.option_strings or action.dest
        for action in parser._actions
        if action.help is not argparse.SUPPRESS and not (action.help or "").strip()
    ]
    assert not unexplained, f"{name}: options without help: {unexplained}"
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--version" in text and "--verbose" in text and "--quiet" in text and "--log-level" in text
    assert not HIDDEN & listed_options(text), text


def listed_options(help_text: str) -> set[str]:
    """The options a --help lists: in the usage lines and at the start of the option lines."""
    usage = re.findall(r"\[(--[\w-]+)", help_text.split("\n\n")[0])
    return set(usage) | set(re.findall(r"^ {2}(?:-\w, )?(--[\w-]+)", help_text, re.MULTILINE))


def test_defaults_are_shown_but_unset_ones_and_secrets_are_not(capsys):
    with pytest.raises(SystemExit):
        run_peer_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "concurrent inference sessions (default: 16)" in text
    assert "multiaddrs to listen on (default: /ip4/0.0.0.0/tcp/0)" in text
    assert "(default: None)" not in text and "(default: False)" not in text
    with pytest.raises(SystemExit):
        build_parser("api").parse_args(["--help"])
    assert "(default: $HEXSWARM_API_KEY, else none)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", [["--version"], *([verb, "--version"] for verb in SUBCOMMANDS)])
def test_version_everywhere(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(command)
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"hexswarm {__version__}"


def test_run_peer_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_peer_parser().parse_args(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"hexswarm {__version__}"


def test_help_answers_in_under_a_second():
    """Each command's --help in a fresh interpreter: no torch or hivemind before a verb runs.
    The bound is 3 s because this machine may be busy; the measured times are printed."""
    commands = {
        "run-peer": ["-m", "hexswarm.peer.cli"],
        "python -m hexswarm": ["-m", "hexswarm"],
        "hexswarm": ["-m", "hexswarm.swarm.commands.cli"],
        **{f"hexswarm {verb}": ["-m", "hexswarm.swarm.commands.cli", verb] for verb in SUBCOMMANDS},
    }
    times = {}
    for name, argv in commands.items():
        began = time.perf_counter()
        result = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, timeout=60)
        times[name] = time.perf_counter() - began
        assert result.returncode == 0 and "usage:" in result.stdout, result.stderr
    print("\n".join(f"{name} --help: {seconds:.2f} s" for name, seconds in times.items()))
    slow = {name: round(seconds, 2) for name, seconds in times.items() if seconds > 3.0}
    assert not slow, slow


PEER = ["m", "--layers", "0:1", *UNREACHABLE]


@pytest.mark.parametrize(
    "argv, message",
    [
        ([*PEER, "--cache-tokens", "0"], "argument --cache-tokens: must be at least 1, got 0"),
        ([*PEER, "--announce-period", "0"], "argument --announce-period: must be positive"),
        ([*PEER, "--max-sessions", "0"], "argument --max-sessions: must be at least 1"),
        ([*PEER, "--max-length", "x"], "argument --max-length: expected an integer, got 'x'"),
        ([*PEER, "--cache-share-per-peer", "1.5"], "argument --cache-share-per-peer: must be in [0, 1]"),
        ([*PEER, "--handshake-timeout", "nan"], "argument --handshake-timeout: expected a finite number"),
        ([*PEER, "--tp", "0"], "argument --tp: must be at least 1"),
        ([*PEER, "--threads", "0"], "argument --threads: must be at least 1"),
        ([*PEER, "--max-blocks", "-1"], "argument --max-blocks: must not be negative"),
        ([*PEER, "--max-batch-sequences", "0"], "argument --max-batch-sequences: must be at least 1"),
        ([*PEER, "--max-batch", "0"], "argument --max-batch: must be at least 1"),
        ([*PEER, "--lease-ttl", "-5"], "argument --lease-ttl: must be positive"),
        ([*PEER, "--public"], "argument --public: not allowed with argument --initial-peers"),
        (["m", "--layers", "0:1", "--public"], "--public: no public bootstrap peers are known"),
        (["m", "--layers", "0:1"], "one of the arguments --initial-peers --public is required"),
    ],
)
def test_run_peer_bad_values_are_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_peer_parser().parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("run-peer: error: ") and message in err, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["api", *UNREACHABLE, "--model", "m", "--port", "70000"], "--port: must be a TCP port in 1..65535"),
        (
            ["api", *UNREACHABLE, "--model", "m", "--max-concurrent", "0"],
            "--max-concurrent: must be at least 1",
        ),
        (["api", *UNREACHABLE, "--model", "m", "--queue-timeout", "0"], "--queue-timeout: must be positive"),
        (["api", "--public", "--model", "m"], "--public: no public bootstrap peers are known"),
        (["api", "--model", "m"], "one of the arguments --initial-peers --public is required"),
        (["monitor", *UNREACHABLE, "--refresh", "0"], "--refresh: must be positive"),
        (["status", *UNREACHABLE, "--timeout", "-1"], "--timeout: must be positive"),
        (["coordinator", *UNREACHABLE, "--model", "m", "--rate", "0"], "--rate: must be positive"),
        (["plan", "--cluster", "c", "--model", "m", "--budget-s", "0"], "--budget-s: must be positive"),
        (["plan", "--cluster", "c", "--model", "m", "--seed", "-1"], "--seed: must not be negative"),
        (["plan", "--cluster", "c", "--model", "m", "--max-batch", "0"], "--max-batch: must be at least 1"),
        (["make-tiny-model", "d", "--layers", "0"], "--layers: must be at least 1"),
        (["generate", "m", *UNREACHABLE, "--max-new-tokens", "0"], "--max-new-tokens: must be at least 1"),
        (["generate", "m", *UNREACHABLE, "--verify", "1.5"], "--verify: must be a share of steps in [0, 1]"),
        (
            ["api", *UNREACHABLE, "--model", "m", "--verify", "x"],
            "--verify: must be a share of steps in [0, 1]",
        ),
        (["demo", "--max-new-tokens", "-3"], "--max-new-tokens: must be at least 1"),
    ],
)
def test_hexswarm_bad_values_are_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"hexswarm {argv[0]}: error: ") and message in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["api", *UNREACHABLE, "--model", "/nonexistent"],
        ["generate", "/nonexistent", *UNREACHABLE],
        ["status", *UNREACHABLE, "--model", "/nonexistent"],
        ["monitor", *UNREACHABLE, "--model", "/nonexistent"],
        ["coordinator", *UNREACHABLE, "--model", "/nonexistent"],
    ],
)
def test_a_bad_model_is_one_line_and_exit_2_before_anything_starts(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert (
        "model '/nonexistent' is not a built-in name" in err and "a GGUF file or a checkpoint folder" in err
    )


def test_a_folder_without_config_is_one_line(tmp_path, capsys):
    assert main(["api", *UNREACHABLE, "--model", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"hexswarm api: error: {tmp_path} has no config.json: not a checkpoint folder"
    )


def test_run_peer_bad_model_is_one_line_and_exit_2(capsys):
    from hexswarm.peer.cli import main as run_peer

    assert run_peer(["/nonexistent", "--layers", "0:1", *UNREACHABLE]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("run-peer: error: model '/nonexistent'"), err


def test_plan_names_its_models_the_same_way(tmp_path, capsys):
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"devices": [{"id": "x", "type": "T4"}]}))
    assert main(["plan", "--cluster", str(cluster), "--model", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a GGUF file, a checkpoint folder or a preset (Llama-2-70B" in err, err


def test_renamed_flags_keep_their_old_spelling():
    args = run_peer_parser().parse_args([*PEER, "--max-batch", "4", "--max-batch-tokens", "8"])
    assert args.max_sequences_per_session == 4 and args.max_batch_sequences == 8
    args = run_peer_parser().parse_args(PEER)
    assert args.max_sequences_per_session == 16 and args.max_batch_sequences == 64
    plan = build_parser("plan")
    assert plan.parse_args(["--cluster", "c", "--model", "m", "--max-batch", "2"]).max_batch_sequences == 2
    assert plan.parse_args(["--cluster", "c", "--model", "m"]).max_batch_sequences == 16


def test_hidden_flags_still_work():
    args = run_peer_parser().parse_args([*PEER, "--no-batching", "--debug-fail-after", "3"])
    assert args.no_batching and args.debug_fail_after == 3


def test_run_peer_defaults_are_those_of_the_peer():
    """peer/flags.py writes these defaults out (their classes import torch): they must agree."""
    from hexswarm.peer.admission import AdmissionLimits
    from hexswarm.peer.cli import batch_policy
    from hexswarm.peer.core import PeerLimits
    from hexswarm.peer.scheduler import BatchPolicy

    args = run_peer_parser().parse_args(PEER)
    assert batch_policy(args) == BatchPolicy()
    assert args.max_sequences_per_session == PeerLimits.max_batch
    assert args.max_sessions_per_peer == AdmissionLimits.sessions_per_remote
    assert args.max_steps_per_second == AdmissionLimits.steps_per_second
    assert args.cache_share_per_peer == AdmissionLimits.cache_share_per_remote


def test_verify_defaults_to_the_public_rate_only_with_public():
    import argparse

    from hexswarm.swarm.commands import cli_args

    assert cli_args.client_verify(argparse.Namespace(verify=None, public=True)) == cli_args.PUBLIC_VERIFY_RATE
    assert cli_args.client_verify(argparse.Namespace(verify=None, public=False)) == 0.0
    assert cli_args.client_verify(argparse.Namespace(verify=0.0, public=True)) == 0.0  # asked: off
    assert cli_args.client_verify(argparse.Namespace(verify=0.5, public=False)) == 0.5


def test_a_short_command_shares_hivemind_futures_by_file_descriptor(monkeypatch):
    """`status` and `generate` end at once: torch's shared-memory daemon ("file_system", hivemind's
    default) would outlive them by seconds, holding the stdout a caller reads to its end."""
    import hexswarm.client.status as status
    from hexswarm.swarm.commands.cli import run_command

    environ = {
        name: value for name, value in os.environ.items() if name != "HIVEMIND_MEMORY_SHARING_STRATEGY"
    }
    monkeypatch.setattr(os, "environ", environ)  # this process's own stays as it was
    seen = []
    monkeypatch.setattr(
        status, "run", lambda args: seen.append(os.environ.get("HIVEMIND_MEMORY_SHARING_STRATEGY"))
    )
    assert run_command("status", UNREACHABLE) == 0
    assert seen == ["file_descriptor"]
