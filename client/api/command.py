"""`hexswarm api`: serve the OpenAI-compatible API (client/api/server.py) over the swarm with uvicorn."""

from __future__ import annotations

import argparse
import os

from hexswarm.swarm.commands import cli_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_initial_peers(parser)
    cli_args.add_model_argument(parser)
    cli_args.add_client_host_maddrs(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address the HTTP server listens on")
    parser.add_argument("--port", type=cli_args.port, default=8000, help="port the HTTP server listens on")
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
        type=cli_args.positive_int,
        default=8,
        help="generations running at once, each with its own swarm session (default 8: what a peer "
        "lets one remote hold; the API is one remote to every peer)",
    )
    parser.add_argument(
        "--max-queue",
        type=cli_args.non_negative_int,
        default=64,
        help="requests that may wait for a running slot; past it, 429 with Retry-After at once",
    )
    parser.add_argument(
        "--queue-timeout",
        type=cli_args.positive_float,
        default=120.0,
        help="seconds a request may wait in the queue before it gets 503 with Retry-After",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=cli_args.positive_int,
        default=1 << 20,
        help="largest request body in bytes; a larger one gets 413 before it is read",
    )
    parser.add_argument(
        "--coverage-timeout",
        type=cli_args.positive_float,
        default=10.0,
        help="seconds to wait for every block to be served before answering 503",
    )
    parser.add_argument(
        "--routing",
        default="tradeoff",
        choices=("tradeoff", "min_latency", "max_throughput"),
        help="how the client picks each request's chain of peers (docs/routing.md)",
    )
    cli_args.add_client_quant(parser)
    cli_args.add_client_verify(parser)


def run(args: argparse.Namespace) -> int:
    cli_args.check_model(args.model)  # before torch and transformers load
    from transformers import AutoTokenizer

    from hexswarm.client import DistributedModelForCausalLM
    from hexswarm.client.api.admission import AdmissionLimits
    from hexswarm.client.api.server import ApiConfig, create_app
    from hexswarm.client.http_serve import serve_until_stopped
    from hexswarm.swarm.models.model_spec import ModelSpecError

    try:
        model = DistributedModelForCausalLM.from_pretrained(
            args.model,
            initial_peers=args.initial_peers,
            routing=args.routing,
            coverage_timeout=args.coverage_timeout,
            host_maddrs=args.host_maddrs,
            quant=args.quant,
            verify=cli_args.client_verify(args),
            verify_min_compared=args.verify_min_compared,
            accept_unsettled=args.accept_unsettled,
        )
    except ModelSpecError as e:
        raise cli_args.UsageError(str(e)) from None
    tokenizer = AutoTokenizer.from_pretrained(model.spec.path)  # a GGUF file's: from its metadata
    name = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    limits = AdmissionLimits(args.max_concurrent, args.max_queue, args.queue_timeout)
    config = ApiConfig(name, args.api_key or None, limits, max_body_bytes=args.max_body_bytes)
    ready = f"api: serving {name} at http://{args.host}:{args.port}/v1"
    app = create_app(model, tokenizer, config)
    try:
        serve_until_stopped(app, args.host, args.port, ready)
    finally:
        model.shutdown()
    return 0
