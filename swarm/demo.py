"""`hexswarm demo`: a private swarm on this machine serving SmolLM2-135M-Instruct, answering.

Starts a bootstrap node and three peers whose layer ranges overlap (real processes on
127.0.0.1), then runs a client process that completes a prompt and answers a chat message,
printing for each the chain of peers it used and its speed. Everything is stopped on exit,
Ctrl-C included. `--tiny` serves a random 8-layer model instead (no package needed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarm.builtin_models import DEFAULT_MODEL
from swarm.launcher import COLOCATED_ENV, LocalSwarm

TINY_LAYERS = 8
# (name, layers) of the real model's 30 layers, and of the tiny model's 8: overlapping ranges,
# so the client has more than one chain to choose from.
REAL_RANGES = (("alice", "0:12"), ("bob", "10:22"), ("carol", "20:30"))
TINY_RANGES = (("alice", "0:4"), ("bob", "2:8"), ("carol", "4:8"))
DEFAULT_PROMPT = "The capital of France is"
DEFAULT_CHAT = "What is the capital of France?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="text to complete greedily")
    parser.add_argument(
        "--chat", default=DEFAULT_CHAT, help="a user message answered through the chat template"
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--tiny", action="store_true", help="serve a random 8-layer Llama instead of SmolLM2 (gibberish)"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where logs (and the tiny model) go")


def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hexswarm-demo-"))
    model, ranges = (_tiny_model(workdir), TINY_RANGES) if args.tiny else (DEFAULT_MODEL, REAL_RANGES)
    if not args.tiny and not _prepare_real_model():
        return 2
    try:
        with LocalSwarm(workdir / "logs", env={"HEXSWARM_CACHE_DIR": str(workdir / "cache")}) as swarm:
            return _run_swarm(swarm, model, ranges, args)
    except KeyboardInterrupt:
        print("\n[demo] interrupted; every process was stopped", flush=True)
        return 130


def _tiny_model(workdir: Path) -> Path:
    model_dir = workdir / "tiny-llama"
    if not (model_dir / "config.json").exists():
        from swarm.tiny_model import make_tiny_model

        print(f"[demo] writing a tiny random Llama ({TINY_LAYERS} layers) to {model_dir}", flush=True)
        make_tiny_model(model_dir, layers=TINY_LAYERS, seed=0)
    return model_dir


def _prepare_real_model() -> bool:
    """Converts the GGUF file's metadata once (cached), so the peers start from the cache."""
    from swarm.model_spec import ModelSpecError, load_model_spec

    began = time.monotonic()
    try:
        spec = load_model_spec(DEFAULT_MODEL)
    except ModelSpecError as e:
        print(f"[demo] {e}", file=sys.stderr)
        return False
    print(
        f"[demo] model {DEFAULT_MODEL}: {spec.model_id}, {spec.num_blocks} layers ({time.monotonic() - began:.1f} s)"
    )
    return True


def _run_swarm(swarm: LocalSwarm, model, ranges, args: argparse.Namespace) -> int:
    began = time.monotonic()
    peers = swarm.start_bootstrap()
    print(f"[demo] bootstrap: {peers[0]}", flush=True)
    procs = [swarm.start_peer(model, layers, name, wait=False) for name, layers in ranges]
    for proc, (name, layers) in zip(procs, ranges, strict=True):
        swarm.wait_for_log(proc, "online:", timeout=300)
        print(f"[demo] peer {name} serves layers [{layers.replace(':', ', ')})", flush=True)
    print(f"[demo] swarm up in {time.monotonic() - began:.1f} s; generating", flush=True)
    client = [sys.executable, "-m", "client", str(model), "--initial-peers", *peers, "--prompt", args.prompt]
    if not args.tiny:
        client += ["--chat", args.chat]
    client += ["--max-new-tokens", str(args.max_new_tokens)]
    env = {**os.environ, **COLOCATED_ENV, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(client, stdin=subprocess.DEVNULL, env=env).returncode
