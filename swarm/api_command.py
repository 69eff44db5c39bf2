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
    parser.add_argument("--max-concurrent", type=int, default=16, help="generations running at once")
    parser.add_argument(
        "--coverage-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for every block to be served before answering 503",
    )
    parser.add_argument(
        "--routing", default="tradeoff", choices=("tradeoff", "min_latency", "max_throughput")
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from transformers import AutoTokenizer

    from client import DistributedModelForCausalLM
    from client.api_server import ApiConfig, create_app

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
    config = ApiConfig(name=name, api_key=args.api_key or None, max_concurrent=args.max_concurrent)
    ready = f"api: serving {name} at http://{args.host}:{args.port}/v1"
    app = create_app(model, tokenizer, config, on_ready=lambda: print(ready, flush=True))
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        model.shutdown()
    return 0
