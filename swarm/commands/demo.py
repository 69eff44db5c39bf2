"""`hexswarm demo`: a private swarm on this machine serving SmolLM2-135M-Instruct, answering.

Starts a bootstrap node and three peers whose layer ranges overlap (real processes on
127.0.0.1), then runs a client process that completes a prompt and answers a chat message,
printing for each the chain of peers it used and its speed. `--tiny` serves a random 8-layer
model instead (no package needed). With `--chat` it runs `hexswarm api` instead of the client,
prints its chat page's address and keeps the swarm up until Ctrl-C.

Whatever ends the demo (the client finishing, an error, Ctrl-C, SIGTERM from a service manager
or `kill`, SIGHUP from a closed terminal), it stops every process it started and removes the
temporary folder it made. The processes run in sessions of their own, so a signal meant for
the demo reaches only the demo: it turns SIGINT, SIGTERM and SIGHUP into an exception that
unwinds through the `finally` blocks that stop them, and only notes further signals while
they run, so a second Ctrl-C cannot cut the cleanup short (each stop is bounded in time).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hexswarm.swarm.commands import cli_args
from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL
from hexswarm.swarm.tools.launcher import COLOCATED_ENV, LocalSwarm, stop_process

TINY_LAYERS = 8
# (name, layers) of the real model's 30 layers, and of the tiny model's 8: overlapping ranges,
# so the client has more than one chain to choose from.
REAL_RANGES = (("alice", "0:12"), ("bob", "10:22"), ("carol", "20:30"))
TINY_RANGES = (("alice", "0:4"), ("bob", "2:8"), ("carol", "4:8"))
DEFAULT_PROMPT = "The capital of France is"
DEFAULT_CHAT = "What is the capital of France?"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
CLIENT_STOP_S = 10.0  # the client gets this long to close its sessions after Ctrl-C, then is killed


class StopSignal(BaseException):
    """A signal that ends the demo, raised in its main thread. A BaseException, like
    KeyboardInterrupt, so that no `except Exception` on the way swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """Handles SIGINT, SIGTERM and SIGHUP for the demo's whole run.

    Inside `armed()` (the work) the first signal raises StopSignal, which `armed()` catches
    once the `finally` blocks it unwound through have stopped the client. Outside it (the
    cleanup) signals are only noted: nothing may cut the cleanup short, and each of its steps
    is bounded in time. `received` is the first signal seen, or None.
    """

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS):
        self.signals, self.received, self._armed = signals, None, False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.signals}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @contextlib.contextmanager
    def armed(self):
        self._armed = True
        try:
            yield
        except StopSignal:
            pass
        finally:
            self._armed = False

    def _handle(self, signum: int, _frame) -> None:
        if self.received is None:
            self.received = signum
        if self._armed:
            self._armed = False  # once: the cleanup the exception unwinds through must finish
            raise StopSignal(signum)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="text to complete greedily")
    parser.add_argument(
        "--message",
        default=DEFAULT_CHAT,
        help="a user message answered through the chat template (not with --tiny)",
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="serve the chat page (hexswarm api) instead, and keep the swarm up until Ctrl-C",
    )
    parser.add_argument(
        "--port", type=cli_args.port, default=8000, help="the chat page's port, with --chat (default 8000)"
    )
    parser.add_argument(
        "--max-new-tokens", type=cli_args.positive_int, default=32, help="tokens to generate for each"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="serve a random 8-layer Llama instead of SmolLM2 (gibberish)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where logs (and the tiny model) go, kept afterwards (default: a temporary folder, removed)",
    )


def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hexswarm-demo-"))
    status = 1
    with StopSignals() as stops:
        swarm = LocalSwarm(workdir / "logs", env={"HEXSWARM_CACHE_DIR": str(workdir / "cache")})
        try:
            with stops.armed():
                status = _run_in(swarm, workdir, args)
        finally:  # also after an error; a signal now is noted, not raised
            swarm.close()
            if args.workdir is None:  # a folder the user named is theirs to keep, logs included
                shutil.rmtree(workdir, ignore_errors=True)
    if stops.received is not None:
        _say(f"\n[demo] stopped by {signal.Signals(stops.received).name}; every process was stopped")
        return 128 + stops.received
    return status


def _run_in(swarm: LocalSwarm, workdir: Path, args: argparse.Namespace) -> int:
    model, ranges = (_tiny_model(workdir), TINY_RANGES) if args.tiny else (DEFAULT_MODEL, REAL_RANGES)
    if not args.tiny and not _prepare_real_model():
        return 2
    return _run_swarm(swarm, model, ranges, args)


def _say(text: str) -> None:
    """Prints, unless the terminal is gone (after SIGHUP a write fails, and must not stop the exit)."""
    try:
        print(text, flush=True)
    except OSError:
        pass


def _tiny_model(workdir: Path) -> Path:
    model_dir = workdir / "tiny-llama"
    if not (model_dir / "config.json").exists():
        from hexswarm.swarm.commands.tiny_model import make_tiny_model

        print(f"[demo] writing a tiny random Llama ({TINY_LAYERS} layers) to {model_dir}", flush=True)
        make_tiny_model(model_dir, layers=TINY_LAYERS, seed=0)
    return model_dir


def _prepare_real_model() -> bool:
    """Converts the GGUF file's metadata once (cached), so the peers start from the cache."""
    from hexswarm.swarm.models.model_spec import ModelSpecError, load_model_spec

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
    if args.chat:
        print(f"[demo] swarm up in {time.monotonic() - began:.1f} s", flush=True)
        return _serve_chat_page(swarm, model, peers, args.port)
    print(f"[demo] swarm up in {time.monotonic() - began:.1f} s; generating", flush=True)
    generate = [
        sys.executable,
        "-m",
        "hexswarm.swarm.commands.cli",
        "generate",
        str(model),
        "--initial-peers",
        *peers,
    ]
    client = [*generate, "--prompt", args.prompt]
    if not args.tiny:
        client += ["--chat", args.message]
    client += ["--max-new-tokens", str(args.max_new_tokens)]
    env = {**os.environ, **COLOCATED_ENV, "PYTHONWARNINGS": "ignore"}
    return _run_client(client, env)


def _serve_chat_page(swarm: LocalSwarm, model, peers: list[str], port: int) -> int:
    """`hexswarm api` over the demo's swarm until a stop signal (or until the API exits)."""
    command = [sys.executable, "-m", "hexswarm.swarm.commands.cli", "api", "--model", str(model),
               "--initial-peers", *peers, "--port", str(port)]  # fmt: skip
    api = swarm.start_command("api", command, ready="api: serving", timeout=300)
    print(f"[demo] chat page: http://127.0.0.1:{port}/ (Ctrl-C stops the swarm)", flush=True)
    while (status := api.popen.poll()) is None:
        time.sleep(0.5)
    print(f"[demo] the API stopped (exit status {status}); its log: {api.log_path}", flush=True)
    return 1


def _run_client(command: list[str], env: dict[str, str]) -> int:
    """Runs the client in a session of its own (its output on this terminal); if the demo is
    stopped first, the client gets a Ctrl-C to close its sessions, then is killed with its group."""
    client = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        return client.wait()
    finally:
        stop_process(client, signal.SIGINT, CLIENT_STOP_S)
