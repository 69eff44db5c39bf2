"""`run-peer`: serve a range of a model's transformer layers to the swarm."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import os
import sys
from typing import NoReturn

import torch

from peer.admission import AdmissionLimits
from peer.core import PeerLimits
from peer.devices import DeviceError, parse_devices
from peer.runtime import PeerConfig, serve
from peer.tp_shard import TPDegreeError, check_degree
from swarm.dht import DEFAULT_HOST_MADDRS, public_initial_peers, quiet_hivemind
from swarm.model_spec import ModelSpecError, load_model_spec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run-peer", description=__doc__)
    p.add_argument("model_dir", help="Hugging Face checkpoint directory (config.json + safetensors)")
    p.add_argument("--layers", required=True, help="blocks to serve, A:B for [A, B)")
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
        type=int,
        default=1,
        metavar="K",
        help="tensor-parallel degree: split every layer over K ranks, one process per device",
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
        "--session-idle-timeout", type=float, default=300.0, help="seconds before an idle session is freed"
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
        "--debug-corrupt-outputs",
        action="store_true",
        help="TESTS ONLY: add noise to every output, to check that clients' verification catches it",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


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
    try:
        start, end = (int(x) for x in text.split(":"))
    except ValueError:
        raise SystemExit(f"--layers must look like A:B, got {text!r}") from None
    if not 0 <= start < end <= num_blocks:
        raise SystemExit(f"--layers {text} is not inside 0:{num_blocks} for this model")
    return start, end


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
    start, end = parse_layers(args.layers, spec.num_blocks)
    try:  # before anything loads or joins the swarm
        devices = parse_devices(args.devices, args.tp, args.device)
        check_degree(spec.config, args.tp)
    except (DeviceError, TPDegreeError) as e:
        print(f"run-peer: {e}", file=sys.stderr)
        return 2
    device = devices[0]
    max_sessions, max_length = args.max_sessions, args.max_length
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
        dtype=choose_dtype(args.dtype, device, getattr(spec.config, "dtype", None)),
        limits=PeerLimits(
            max_sessions=max_sessions,
            max_length=max_length,
            max_batch=args.max_batch,
            cache_tokens=args.cache_tokens or max_sessions * max_length,
            session_idle_timeout=args.session_idle_timeout,
        ),
        announce_period=args.announce_period,
        drain_timeout=args.drain_timeout,
        max_frame_bytes=int(args.max_frame_mb * (1 << 20)),
        throughput=args.throughput,
        decode_ms=args.decode_ms,
        tp_timeout=args.tp_timeout,
        admission=AdmissionLimits(
            sessions_per_remote=args.max_sessions_per_peer, steps_per_second=args.max_steps_per_second
        ),
        debug_corrupt_outputs=args.debug_corrupt_outputs,
    )
    _setup_logging(args, spec.model_id, start, end)
    code = asyncio.run(serve(config))
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    """Exits once serve() has stopped everything, skipping the interpreter's finalization.

    The atexit handlers still run (temporary identity files, multiprocessing's bookkeeping);
    what is skipped is tearing down torch's and transformers' modules object by object, which
    takes seconds on a loaded machine and would break the bounded shutdown (README "Limits,
    shutdown and verification").
    """
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _setup_logging(args, model_id: str, start: int, end: int) -> None:
    who = f"{args.name + ' ' if args.name else ''}{model_id}[{start}:{end})"
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=f"%(asctime)s %(levelname)s peer {who}: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
    quiet_hivemind()


if __name__ == "__main__":
    sys.exit(main())
