"""`hexswarm demo`: a private swarm on this machine, generating text with a built-in tiny model.

Starts a bootstrap node and three peers with overlapping layer ranges (real processes on
127.0.0.1), then runs a client process that generates from a prompt and prints the chain it
used and its speed. Everything is stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarm.launcher import COLOCATED_ENV, LocalSwarm

DEMO_LAYERS = 8
PEER_RANGES = (("alice", "0:4"), ("bob", "2:8"), ("carol", "4:8"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", default="A swarm of volunteers")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where models and logs go (default: a temp dir)"
    )


def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hexswarm-demo-"))
    model_dir = workdir / "tiny-llama"
    if not (model_dir / "config.json").exists():
        from swarm.tiny_model import make_tiny_model

        print(f"[demo] writing a tiny random Llama ({DEMO_LAYERS} layers) to {model_dir}", flush=True)
        make_tiny_model(model_dir, layers=DEMO_LAYERS, seed=0)
    try:
        with LocalSwarm(workdir / "logs", env={"HEXSWARM_CACHE_DIR": str(workdir / "cache")}) as swarm:
            return _run_swarm(swarm, model_dir, args)
    except KeyboardInterrupt:
        print("\n[demo] interrupted; every process was stopped", flush=True)
        return 130


def _run_swarm(swarm: LocalSwarm, model_dir: Path, args: argparse.Namespace) -> int:
    began = time.monotonic()
    peers = swarm.start_bootstrap()
    print(f"[demo] bootstrap: {peers[0]}", flush=True)
    procs = [swarm.start_peer(model_dir, layers, name, wait=False) for name, layers in PEER_RANGES]
    for proc, (name, layers) in zip(procs, PEER_RANGES, strict=True):
        swarm.wait_for_log(proc, "online:", timeout=180)
        print(f"[demo] peer {name} serves layers [{layers.replace(':', ', ')})", flush=True)
    print(f"[demo] swarm up in {time.monotonic() - began:.1f} s; generating", flush=True)
    client = [
        sys.executable,
        "-m",
        "client",
        str(model_dir),
        "--initial-peers",
        *peers,
        "--prompt",
        args.prompt,
        "--max-new-tokens",
        str(args.max_new_tokens),
    ]
    env = {**os.environ, **COLOCATED_ENV}
    return subprocess.run(client, stdin=subprocess.DEVNULL, env=env).returncode
