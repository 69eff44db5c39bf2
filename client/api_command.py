"""`hexswarm api`: serve the OpenAI-compatible API (client/api_server.py) over the swarm with uvicorn."""

from __future__ import annotations

import argparse
import os


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--initial-peers", nargs="+", help="multiaddrs of swarm members")
    where.add_argument("--public", action="store_true", help="use the public swarm")
    parser.add_argument(
        "--model",
        required=True,
        help="a built-in model name (hexswarm models), a GGUF file or a checkpoint directory",
    )
    parser.add_argument(
        "--host-maddrs",
        nargs="+",
        default=None,
        help="p2p addresses to listen on (default: none; this client only dials out and asks no router for a port)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("HEXSWARM_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $HEXSWARM_API_KEY, else none)",
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients use (default: --model's last path part)",
    )
    parser.add_argument(
        "--max-concurrent",
        type=_at_least(1),
        default=16,
        help="generations running at once, each with its own swarm session (default: 16)",
    )
    parser.add_argument(
        "--max-queue",
        type=_at_least(0),
        default=64,
        help="requests that may wait for a running slot; past it, 429 with Retry-After at once (default: 64)",
    )
    parser.add_argument(
        "--queue-timeout",
        type=float,
        default=120.0,
        help="seconds a request may wait in the queue before it gets 503 with Retry-After (default: 120)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=_at_least(1),
        default=1 << 20,
        help="largest request body; a larger one gets 413 before it is read (default: 1048576, 1 MiB)",
    )
    parser.add_argument(
        "--coverage-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for every block to be served before answering 503",
    )
    parser.add_argument(
        "--routing", default="tradeoff", choices=("tradeoff", "min_latency", "max_throughput")
    )


def _at_least(lowest: int):
    """An argparse type: an integer no smaller than `lowest` (a usage error otherwise)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest}, got {value}")
        return value

    return parse


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from transformers import AutoTokenizer

    from client import DistributedModelForCausalLM
    from client.api_admission import AdmissionLimits
    from client.api_server import ApiConfig, create_app

    if not args.queue_timeout > 0:
        raise SystemExit(f"hexswarm api: --queue-timeout must be positive, got {args.queue_timeout}")

    model = DistributedModelForCausalLM.from_pretrained(
        args.model,
        initial_peers=args.initial_peers,
        public=args.public,
        routing=args.routing,
        coverage_timeout=args.coverage_timeout,
        host_maddrs=args.host_maddrs,
    )
    tokenizer = AutoTokenizer.from_pretrained(model.spec.path)  # a GGUF file's: from its metadata
    name = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    limits = AdmissionLimits(args.max_concurrent, args.max_queue, args.queue_timeout)
    config = ApiConfig(name, args.api_key or None, limits, max_body_bytes=args.max_body_bytes)
    ready = f"api: serving {name} at http://{args.host}:{args.port}/v1"
    app = create_app(model, tokenizer, config, on_ready=lambda: print(ready, flush=True))
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        model.shutdown()
    return 0
