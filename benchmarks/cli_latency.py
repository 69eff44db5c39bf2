"""How long the commands a new user types take to answer, on a running SmolLM2 swarm.

    python benchmarks/cli_latency.py [--repeats 3] [--save]   # ~2 min; one JSON line per command

(--save: also write the lines and the summary to benchmarks/results/cli_latency.json)

Starts a bootstrap and two SmolLM2 peers (blocks 0:15 and 15:30) on 127.0.0.1, then runs each
command as a user would, as a fresh process, `--repeats` times, and prints one JSON line per
command: `command`, `s` (the median wall time from start to exit), `min_s`, `max_s`, `goal_s`
(issue 40's goals) and `ok` (whether it exited as expected). A last line sums them up. The
`generate` lines run the whole command: start, imports, joining the DHT, routing, prefill and
the tokens; "generate, first token" is the time from start until the streamed output shows its
first character (`hexswarm generate` prints the output as it is generated).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_results import save, stamp

from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL
from hexswarm.swarm.tools.launcher import LocalSwarm

HEXSWARM = (sys.executable, "-m", "hexswarm.swarm.commands.cli")
RUN_PEER = (sys.executable, "-m", "hexswarm.peer.cli")
USAGE_ERROR = 2


def commands(initial_peers: list[str]) -> list[tuple[str, tuple[str, ...], float, int]]:
    """(name, argv, goal in seconds, expected exit status) of each command timed."""
    peers = ("--initial-peers", *initial_peers)
    return [
        ("hexswarm --help", (*HEXSWARM, "--help"), 0.3, 0),
        ("run-peer --help", (*RUN_PEER, "--help"), 0.3, 0),
        ("run-peer: malformed --layers", (*RUN_PEER, DEFAULT_MODEL, "--layers", "0-10", *peers), 0.5, USAGE_ERROR),
        ("run-peer: reversed --layers", (*RUN_PEER, DEFAULT_MODEL, "--layers", "25:20", *peers), 0.5, USAGE_ERROR),
        ("generate: unknown model", (*HEXSWARM, "generate", "no-such-model", *peers), 0.5, USAGE_ERROR),
        ("generate: mistyped flag", (*HEXSWARM, "generate", DEFAULT_MODEL, "--inital-peers", initial_peers[0]), 0.5, USAGE_ERROR),
        ("status", (*HEXSWARM, "status", *peers), 2.0, 0),
        ("generate, 1 token", (*HEXSWARM, "generate", DEFAULT_MODEL, *peers, "--max-new-tokens", "1"), 3.0, 0),
        ("generate, first token", (*HEXSWARM, "generate", DEFAULT_MODEL, *peers, "--max-new-tokens", "8"), 3.0, 0),
    ]  # fmt: skip


FIRST_OUTPUT = b"output: '"  # what `hexswarm generate` prints before the first token's text


def time_command(
    argv: tuple[str, ...], expected: int, repeats: int, until_output: bool = False
) -> tuple[list[float], bool]:
    """Wall seconds of each run of `argv` (to its exit, or with `until_output` to its first
    output character), and whether every run exited with `expected`."""
    times, ok = [], True
    for _ in range(repeats):
        began = time.perf_counter()
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
            seen, first_at = b"", None
            while chunk := proc.stdout.read1(4096):
                seen += chunk
                at = seen.find(FIRST_OUTPUT)
                if first_at is None and at >= 0 and len(seen) > at + len(FIRST_OUTPUT):
                    first_at = time.perf_counter()
            ok &= proc.wait(timeout=300) == expected and (first_at is not None or not until_output)
        times.append((first_at if until_output and first_at else time.perf_counter()) - began)
    return times, ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each command (the median is reported)"
    )
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/cli_latency.json")
    args = parser.parse_args()
    started = stamp()
    summary, lines = {"commands": 0, "within_goal": 0, "all_ok": True}, []
    with tempfile.TemporaryDirectory() as tmp, LocalSwarm(Path(tmp)) as swarm:
        swarm.start_bootstrap()
        procs = [
            swarm.start_peer(DEFAULT_MODEL, layers, name, wait=False)
            for name, layers in (("a", "0:15"), ("b", "15:30"))
        ]
        for proc in procs:
            swarm.wait_for_log(proc, "online:", timeout=300)
        for name, argv, goal, expected in commands(swarm.initial_peers):
            times, ok = time_command(argv, expected, args.repeats, until_output=name.endswith("first token"))
            median = statistics.median(times)
            line = {"command": name, "s": round(median, 3), "min_s": round(min(times), 3),
                    "max_s": round(max(times), 3), "goal_s": goal, "ok": ok}  # fmt: skip
            print(json.dumps(line), flush=True)
            lines.append(line)
            summary["commands"] += 1
            summary["within_goal"] += median <= goal
            summary["all_ok"] &= ok
    print(json.dumps({"bench": "cli_latency", **summary}))
    if args.save:
        save(
            "cli_latency",
            {"bench": "cli_latency", **summary, "lines": lines, "started": started, "ended": stamp()},
        )


if __name__ == "__main__":
    main()
