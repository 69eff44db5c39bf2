"""`run-peer`: serve a range of a model's transformer layers to the swarm."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import os
import sys
from typing import NoReturn

from swarm.threads import configure_openmp

configure_openmp()  # before torch loads (see swarm/threads.py)

# ruff: noqa: E402
import torch

from peer import faults
from peer.admission import AdmissionLimits
from peer.core import PeerLimits
from peer.debug import parse_record_override
from peer.devices import DeviceError, cpu_cores, default_cpu_threads, parse_devices
from peer.runtime import PeerConfig, serve
from peer.scheduler import BatchPolicy
from peer.tp_shard import TPDegreeError, check_degree, valid_degrees
from swarm import log_setup
from swarm.coordinator.command import add_coordination_arguments, coordinator_config
from swarm.coordinator.records import trust_from
from swarm.dht import DEFAULT_HOST_MADDRS, public_initial_peers
from swarm.model_spec import ModelSpecError, load_model_spec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run-peer", description=__doc__)
    p.add_argument(
        "model_dir",
        metavar="MODEL",
        help="a built-in model name (hexswarm models), a GGUF file or a checkpoint directory (config.json + safetensors)",
    )
    p.add_argument(
        "--layers",
        required=True,
        help="blocks to serve, A:B for [A, B) (never moved), or auto: the coordinator's plan "
        "(or, with no coordinator, Petals' rule) chooses and may move them",
    )
    p.add_argument(
        "--max-blocks", type=int, default=0, help="with --layers auto: most blocks to hold (default all)"
    )
    p.add_argument("--region", default="", help="a region label for the coordinator (default: inferred)")
    p.add_argument(
        "--rebalance-period",
        type=float,
        default=60.0,
        help="seconds between Petals' rule checks (no coordinator)",
    )
    p.add_argument(
        "--move-wait", type=float, default=30.0, help="longest a move waits for its old range to be covered"
    )
    p.add_argument(
        "--coordinator",
        action="store_true",
        help="also run a coordinator candidate for this model in this peer",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--initial-peers", nargs="+", help="multiaddrs of swarm members, e.g. the bootstrap's")
    where.add_argument("--public", action="store_true", help="join the public swarm")
    p.add_argument(
        "--host-maddrs", nargs="+", default=list(DEFAULT_HOST_MADDRS), help="multiaddrs to listen on"
    )
    p.add_argument("--announce-maddrs", nargs="+", default=[], help="public multiaddrs to tell others")
    p.add_argument(
        "--identity", default=None, help="identity key file (created if missing): a stable peer id"
    )
    p.add_argument("--name", default=None, help="a human-friendly name shown in status")
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu, cuda or cuda:N"
    )
    p.add_argument(
        "--tp",
        type=_auto_or_int,
        default=1,
        metavar="auto|K",
        help="tensor-parallel degree: split every layer over K ranks, one process per device "
        "(auto: one rank per device of --devices; with --layers auto the plan chooses the degree)",
    )
    p.add_argument(
        "--devices",
        default=None,
        help="device of each rank, e.g. cuda:0,cuda:1 or cpu,cpu (default: cuda:0..K-1 on GPU, else cpu x K)",
    )
    p.add_argument(
        "--tp-timeout",
        type=float,
        default=30.0,
        help="seconds any collective may take and a rank may stay silent before the group is declared failed",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", *DTYPES],
        help="compute dtype; auto = the checkpoint's on GPU, float32 on CPU",
    )
    p.add_argument("--max-sessions", type=int, default=16, help="concurrent inference sessions")
    p.add_argument(
        "--max-length", type=int, default=2048, help="longest sequence a session may reach (tokens)"
    )
    p.add_argument("--max-batch", type=int, default=16, help="largest batch of sequences in one session")
    p.add_argument(
        "--cache-tokens",
        type=int,
        default=None,
        help="KV-cache budget in tokens over all sessions (default max-sessions x max-length)",
    )
    p.add_argument(
        "--handshake-timeout",
        type=float,
        default=30.0,
        help="seconds a stream may stay open before it opens a session (default 30)",
    )
    p.add_argument(
        "--session-idle-timeout", type=float, default=300.0, help="seconds before an idle session is freed"
    )
    p.add_argument(
        "--max-session-cache-tokens",
        type=int,
        default=None,
        help="most KV-cache tokens one session may reserve (default a quarter of --cache-tokens, "
        "at least --max-length)",
    )
    p.add_argument(
        "--cache-share-per-peer",
        type=float,
        default=AdmissionLimits.cache_share_per_remote,
        help="share of the KV cache one remote peer id's sessions may reserve together (default 0.5; 0: no limit)",
    )
    p.add_argument(
        "--max-sessions-per-peer",
        type=int,
        default=AdmissionLimits.sessions_per_remote,
        help="open sessions one remote peer id may hold here (0: no limit)",
    )
    p.add_argument(
        "--max-steps-per-second",
        type=float,
        default=AdmissionLimits.steps_per_second,
        help="steps per second one session may send, with 2 s of burst (0: no limit)",
    )
    p.add_argument("--announce-period", type=float, default=15.0, help="seconds between DHT record refreshes")
    p.add_argument(
        "--drain-timeout", type=float, default=30.0, help="seconds open sessions get to finish on exit"
    )
    p.add_argument("--max-frame-mb", type=float, default=64.0, help="largest frame accepted (MiB)")
    p.add_argument(
        "--throughput",
        type=_auto_or_positive,
        default=None,
        metavar="auto|TOKENS_PER_S",
        help="announce this prefill throughput (tokens/s per block) instead of measuring it",
    )
    p.add_argument(
        "--decode-ms",
        type=_auto_or_positive,
        default=None,
        metavar="auto|MS",
        help="announce this decode time (ms per block) instead of measuring it",
    )
    p.add_argument(
        "--batch-window-ms",
        type=float,
        default=BatchPolicy.batch_window_ms,
        help="longest wait for other sessions' decode steps to join a batch (ms); a batch runs "
        "at once when every open session has a step waiting",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=BatchPolicy.max_batch_tokens,
        help="most decode rows (sequences) in one batched forward",
    )
    p.add_argument(
        "--no-batching",
        action="store_true",
        help="run every step on its own, in arrival order (the baseline of benchmarks/concurrency.py)",
    )
    p.add_argument(
        "--prefill-chunk-tokens",
        type=int,
        default=BatchPolicy.prefill_chunk_tokens,
        help="run prompts this many tokens at a time, between other sessions' decode steps (0: whole)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch compute threads (default on CPU: 1 for models whose hidden x intermediate size "
        "is under 1M, else the cores this process may use)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="same as --log-level debug")
    log_setup.add_log_arguments(p)
    add_coordination_arguments(p)
    faults.add_arguments(p)  # hidden --debug-* flags for failover tests
    return p


def _auto_or_int(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer, got {text!r}") from None


def _auto_or_positive(text: str) -> float | None:
    """'auto' (measure) or a positive number: operators may announce their own figures to steer load."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def parse_layers(text: str, num_blocks: int) -> tuple[int, int]:
    """[A, B) from "A:B"; a usage error (exit status 2, one line) when it does not fit the model."""
    try:
        start, end = (int(x) for x in text.split(":"))
    except ValueError:
        _usage_error(f"--layers must look like A:B, got {text!r}")
    if not 0 <= start < end <= num_blocks:
        _usage_error(f"--layers {text} is not inside 0:{num_blocks} for this model")
    return start, end


def _usage_error(message: str) -> NoReturn:
    print(f"run-peer: {message}", file=sys.stderr)
    raise SystemExit(2)


def choose_dtype(name: str, device: torch.device, checkpoint_dtype) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda" and checkpoint_dtype in (torch.float16, torch.bfloat16):
        return checkpoint_dtype
    return torch.float32 if device.type == "cpu" else torch.float16


def main(argv: list[str] | None = None) -> int:
    """Parses the flags and serves; a peer that ran exits the process itself (see exit_now)."""
    args = build_parser().parse_args(argv)
    try:
        spec = load_model_spec(args.model_dir)
    except (ModelSpecError, OSError) as e:
        print(f"run-peer: {e}", file=sys.stderr)
        return 2
    auto = args.layers == "auto"
    start, end = (0, spec.num_blocks) if auto else parse_layers(args.layers, spec.num_blocks)
    tp_auto = args.tp is None
    if tp_auto:  # one rank per offered device
        args.tp = len(args.devices.split(",")) if args.devices else 1
    if args.max_blocks < 0:
        print("run-peer: --max-blocks must not be negative", file=sys.stderr)
        return 2
    try:  # before anything loads or joins the swarm
        devices = parse_devices(args.devices, args.tp, args.device)
        check_degree(spec.config, args.tp)
    except (DeviceError, TPDegreeError) as e:
        print(f"run-peer: {e}", file=sys.stderr)
        return 2
    # --layers auto --tp auto: the plan chooses the degree too, among those that split the model.
    tp_choices = valid_degrees(spec.config, args.tp) if auto and tp_auto else ()
    prefill_threads = None
    if args.threads is not None:
        if args.threads < 1:
            print("run-peer: --threads must be at least 1", file=sys.stderr)
            return 2
        torch.set_num_threads(args.threads)
    elif devices[0].type == "cpu" and len(devices) == 1:
        torch.set_num_threads(default_cpu_threads(spec.config))
        prefill_threads = cpu_cores()  # decode may run on one thread; a long prompt wants every core
    batch = _batch_policy(args)
    if batch is None:
        return 2
    try:
        coordinator_trust = trust_from(args.coordinator_key, args.public)
    except ValueError as e:
        print(f"run-peer: {e}", file=sys.stderr)
        return 2
    device = devices[0]
    max_sessions, max_length = args.max_sessions, args.max_length
    cache_tokens = args.cache_tokens or max_sessions * max_length
    if not args.handshake_timeout > 0:
        print("run-peer: --handshake-timeout must be > 0", file=sys.stderr)
        return 2
    if not 0 <= args.cache_share_per_peer <= 1:
        print("run-peer: --cache-share-per-peer must be in [0, 1]", file=sys.stderr)
        return 2
    config = PeerConfig(
        spec=spec,
        start=start,
        end=end,
        initial_peers=tuple(public_initial_peers() if args.public else args.initial_peers),
        host_maddrs=tuple(args.host_maddrs),
        announce_maddrs=tuple(args.announce_maddrs),
        identity_path=args.identity,
        name=args.name,
        devices=devices,
        tp_choices=tp_choices if len(tp_choices) > 1 else (),
        dtype=choose_dtype(args.dtype, device, getattr(spec.config, "dtype", None)),
        limits=PeerLimits(
            max_sessions=max_sessions,
            max_length=max_length,
            max_batch=args.max_batch,
            cache_tokens=cache_tokens,
            session_cache_tokens=args.max_session_cache_tokens or max(cache_tokens // 4, max_length),
            session_idle_timeout=args.session_idle_timeout,
        ),
        announce_period=args.announce_period,
        drain_timeout=args.drain_timeout,
        max_frame_bytes=int(args.max_frame_mb * (1 << 20)),
        handshake_timeout=args.handshake_timeout,
        throughput=args.throughput,
        decode_ms=args.decode_ms,
        tp_timeout=args.tp_timeout,
        auto=auto,
        max_blocks=args.max_blocks,
        region=args.region,
        rebalance_period=args.rebalance_period,
        move_wait=args.move_wait,
        coordinator=coordinator_config(args, args.model_dir) if args.coordinator else None,
        coordinator_trust=coordinator_trust,
        batch=batch,
        faults=faults.plan_from_args(args),
        admission=AdmissionLimits(
            sessions_per_remote=args.max_sessions_per_peer,
            steps_per_second=args.max_steps_per_second,
            cache_share_per_remote=args.cache_share_per_peer,
        ),
        debug_corrupt_outputs=args.debug_corrupt_outputs,
        debug_record=dict(map(parse_record_override, args.debug_record)),
        prefill_threads=prefill_threads,
    )
    _setup_logging(args, spec.model_id, "[auto]" if auto else f"[{start}:{end})")
    code = asyncio.run(serve(config))
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    """Exits once serve() has stopped everything, skipping the interpreter's finalization.

    The atexit handlers still run (temporary identity files, multiprocessing's bookkeeping);
    what is skipped is tearing down torch's and transformers' modules object by object, which
    takes seconds on a loaded machine and would break the bounded shutdown (docs/reliability.md
    "Bounded shutdown").
    """
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _batch_policy(args) -> BatchPolicy | None:
    if args.batch_window_ms < 0 or args.max_batch_tokens < 1 or args.prefill_chunk_tokens < 0:
        print(
            "run-peer: --batch-window-ms and --prefill-chunk-tokens must be >= 0, --max-batch-tokens >= 1",
            file=sys.stderr,
        )
        return None
    return BatchPolicy(
        batching=not args.no_batching,
        batch_window_ms=args.batch_window_ms,
        max_batch_tokens=args.max_batch_tokens,
        prefill_chunk_tokens=args.prefill_chunk_tokens,
    )


def _setup_logging(args, model_id: str, layers: str) -> None:
    if args.verbose and args.log_level is None:
        args.log_level = "debug"
    # the name, when not given, is known once the peer has joined (peer/runtime.py updates it)
    log_setup.setup_logging(args, log_context(args.name, model_id, layers))


def log_context(name: str | None, model_id: str, layers: str) -> str:
    """What a peer's log lines are about: `peer alice tiny-3f2a[0:4)` (layers "[auto]" until placed)."""
    return f"peer {name + ' ' if name else ''}{model_id}{layers}"


if __name__ == "__main__":
    sys.exit(main())
