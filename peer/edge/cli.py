"""`edge-peer`: serve a range of a model's layers over py-libp2p, without hivemind.

It joins a swarm through full nodes (`--initial-peers`, a `hexswarm bootstrap`), which relay its
signed record; clients need nothing new to reach it. torch loads only once the flags are parsed.
"""

from __future__ import annotations

import argparse
import asyncio

from hexswarm.swarm.tools.threads import configure_openmp

configure_openmp()  # before torch loads (see swarm/tools/threads.py)

# ruff: noqa: E402
from hexswarm.peer.cli import log_context, parse_layers
from hexswarm.swarm.commands import cli_args
from hexswarm.swarm.commands.cli_args import UsageError
from hexswarm.swarm.tools import log_setup

DEFAULT_LISTEN = ("/ip4/0.0.0.0/tcp/0",)


def build_parser() -> argparse.ArgumentParser:
    p = cli_args.new_parser(
        "edge-peer", "Serve a range of a model's layers over py-libp2p (no hivemind, no p2pd)."
    )
    cli_args.add_model_argument(p, positional=True)
    p.add_argument(
        "--layers", required=True, type=cli_args.layer_range, help="blocks to serve, A:B for [A, B)"
    )
    cli_args.add_initial_peers(p)
    p.add_argument(
        "--host-maddrs",
        nargs="+",
        default=list(DEFAULT_LISTEN),
        metavar="MADDR",
        help="TCP multiaddrs to listen on",
    )
    p.add_argument(
        "--identity", required=True, help="RSA identity key file (created if missing); keeps the peer id"
    )
    p.add_argument("--name", default="", help="a human-friendly name (default: the end of the peer id)")
    p.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="dtype of the blocks (CPU)"
    )
    p.add_argument("--max-sessions", type=cli_args.positive_int, default=16, help="open sessions at once")
    p.add_argument("--max-length", type=cli_args.positive_int, default=2048, help="tokens per sequence")
    p.add_argument(
        "--cache-tokens", type=cli_args.positive_int, default=16 * 2048, help="KV-cache tokens in all"
    )
    p.add_argument(
        "--announce-period", type=cli_args.positive_float, default=15.0, help="seconds between announcements"
    )
    p.add_argument(
        "--throughput",
        type=cli_args.positive_float,
        default=None,
        help="announce this prefill tokens/s per block instead of measuring",
    )
    p.add_argument(
        "--decode-ms",
        type=cli_args.positive_float,
        default=None,
        help="announce this decode ms per block instead of measuring",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = edge_config(args)
    except UsageError as e:
        return cli_args.usage_error("edge-peer", str(e))
    from hexswarm.peer.edge.runtime import serve

    log_setup.setup_logging(
        args, log_context(config.name, config.spec.model_id, f"[{config.start}:{config.end})")
    )
    return asyncio.run(serve(config))


def edge_config(args: argparse.Namespace):
    """The EdgeConfig the flags ask for; UsageError for what the parser cannot check."""
    cli_args.check_model(args.model)
    import torch

    from hexswarm.peer.core import PeerLimits
    from hexswarm.peer.edge.runtime import EdgeConfig
    from hexswarm.swarm.models.model_spec import ModelSpecError, load_model_spec

    try:
        spec = load_model_spec(args.model)
    except (ModelSpecError, OSError) as e:
        raise UsageError(str(e)) from None
    start, end = parse_layers(args.layers, spec.num_blocks)
    cache_tokens = max(args.cache_tokens, args.max_length)
    return EdgeConfig(
        spec=spec,
        start=start,
        end=end,
        initial_peers=tuple(args.initial_peers),
        host_maddrs=tuple(args.host_maddrs),
        identity_path=args.identity,
        name=args.name or "edge",
        dtype=getattr(torch, args.dtype),
        limits=PeerLimits(
            max_sessions=args.max_sessions,
            max_length=args.max_length,
            cache_tokens=cache_tokens,
            session_cache_tokens=max(cache_tokens // 4, args.max_length),
        ),
        announce_period=args.announce_period,
        throughput=args.throughput,
        decode_ms=args.decode_ms,
    )
