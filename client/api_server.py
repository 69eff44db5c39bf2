"""`hexswarm api`: an OpenAI-compatible HTTP API over the swarm (FastAPI + uvicorn).

Serves `/v1/models`, `/v1/completions` and `/v1/chat/completions` for one model, whose
transformer layers run in the swarm. Each request runs `generate()` in a worker thread with
its own swarm session (client/api_generation.py); streamed answers are server-sent events.
When a client disconnects mid-stream, its generation stops after the step in flight and its
session is closed on every peer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from client.api_generation import SamplingSettings, start_generation
from client.api_schema import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    ApiError,
    ChatRequest,
    CompletionRequest,
    ResponseShape,
    bad_request,
)
from client.api_text import Finished, TextAssembler, text_deltas
from client.remote import PeerError
from client.swarm_client import MissingBlocksError

logger = logging.getLogger(__name__)

DEFAULT_CHAT_MAX_TOKENS = (
    256  # OpenAI's default is "the rest of the context"; that would reserve huge sessions
)
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@dataclass
class ApiConfig:
    """What one server serves and how."""

    name: str  # the model name clients pass ("model": ...)
    api_key: str | None = None
    max_concurrent: int = 16  # generations running at once; more requests wait their turn
    default_chat_max_tokens: int = DEFAULT_CHAT_MAX_TOKENS


def create_app(model, tokenizer, config: ApiConfig, on_ready=None) -> FastAPI:
    """The FastAPI app serving `model` (a DistributedModelForCausalLM, or any HF causal LM);
    `on_ready()` is called once the server listens."""
    executor = ThreadPoolExecutor(config.max_concurrent, thread_name_prefix="api-generate")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if on_ready is not None:
            on_ready()
        yield
        executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="hexswarm OpenAI-compatible API", lifespan=lifespan)
    context = getattr(model.config, "max_position_embeddings", None)
    started = int(time.time())
    if tokenizer.chat_template is None:
        logger.warning("the tokenizer has no chat template; chat requests use a plain 'role: content' one")
        tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    def check_key(request: Request) -> None:
        if not config.api_key:  # no key (or an empty one) set: the API is open
            return
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not secrets.compare_digest(given.encode(), config.api_key.encode()):
            raise ApiError(401, "missing or wrong API key", "invalid_request_error", code="invalid_api_key")

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        error = bad_request(f"{where or 'body'}: {first.get('msg', 'invalid request')}", where)
        return JSONResponse(error.body(), status_code=error.status)

    @app.get("/v1/models", dependencies=[Depends(check_key)])
    async def models() -> dict:
        entry = {"id": config.name, "object": "model", "created": started, "owned_by": "hexswarm"}
        return {"object": "list", "data": [entry]}

    @app.post("/v1/completions", dependencies=[Depends(check_key)])
    async def completions(body: CompletionRequest):
        body.check_supported()
        return await _serve(body, _completion_ids(tokenizer, body.prompt), chat=False)

    @app.post("/v1/chat/completions", dependencies=[Depends(check_key)])
    async def chat_completions(body: ChatRequest):
        body.check_supported()
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        return await _serve(body, ids, chat=True)

    async def _serve(body: CompletionRequest | ChatRequest, ids: list[int], chat: bool):
        if body.model != config.name:
            raise ApiError(
                404,
                f"model {body.model!r} is not served here; try {config.name!r}",
                "invalid_request_error",
                code="model_not_found",
                param="model",
            )
        max_tokens = _max_tokens(body, chat, config)
        if not ids:
            raise bad_request("the prompt is empty", "prompt")
        if context is not None and len(ids) + max_tokens > context:
            raise bad_request(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's context of {context}",
                "max_tokens",
            )
        settings = SamplingSettings(max_tokens, body.temperature, body.top_p, body.seed)
        stream = start_generation(model, executor, torch.tensor([ids]), settings)
        pieces = text_deltas(stream, TextAssembler(tokenizer, body.stop_strings()), max_tokens, eos_ids)
        shape = ResponseShape(chat, config.name)
        try:
            first = await _next_piece(pieces)  # errors before the first token get their HTTP status
        except BaseException:
            stream.cancel.set()
            raise
        if not body.stream:
            return await _whole(first, pieces, shape, len(ids), stream.cancel)
        events = _sse(first, pieces, shape, len(ids), body.include_usage_in_stream(), stream.cancel)
        return StreamingResponse(events, media_type="text/event-stream")

    return app


def _completion_ids(tokenizer, prompt: str | list) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        if any(not 0 <= t < len(tokenizer) for t in prompt):
            raise bad_request("prompt token ids must be in the vocabulary", "prompt")
        return list(prompt)
    text = prompt[0] if isinstance(prompt, list) and prompt else prompt
    return tokenizer(text or "").input_ids


def _max_tokens(body, chat: bool, config: ApiConfig) -> int:
    asked = body.max_tokens
    if chat and body.max_completion_tokens is not None:
        asked = body.max_completion_tokens
    if asked is not None:
        return asked
    return config.default_chat_max_tokens if chat else DEFAULT_COMPLETION_MAX_TOKENS


async def _next_piece(pieces: AsyncIterator) -> str | Finished:
    try:
        return await pieces.__anext__()
    except (MissingBlocksError, PeerError, ValueError, NotImplementedError) as e:
        raise _as_api_error(e) from None


def _as_api_error(error: BaseException) -> ApiError:
    """What generate() raised, as the HTTP error a client should see."""
    if isinstance(error, MissingBlocksError):
        return ApiError(503, str(error), "service_unavailable", code="missing_blocks")
    if isinstance(error, PeerError):
        return ApiError(503, str(error), "service_unavailable", code="peer_error")
    return bad_request(str(error))


async def _whole(first, pieces: AsyncIterator, shape: ResponseShape, prompt_tokens: int, cancel) -> dict:
    text, piece = [], first
    try:
        while not isinstance(piece, Finished):
            text.append(piece)
            piece = await _next_piece(pieces)
    finally:
        cancel.set()  # a no-op once generation ended; stops it if this handler was cancelled
    return shape.whole("".join(text), piece.reason, prompt_tokens, piece.completion_tokens)


def _event(body: dict) -> bytes:
    return f"data: {json.dumps(body)}\n\n".encode()


async def _sse(first, pieces, shape: ResponseShape, prompt_tokens: int, include_usage: bool, cancel):
    """Server-sent events; when the client goes away, closing this generator stops the generation."""
    piece, sent, done = first, 0, False
    try:
        if shape.chat:  # OpenAI's first chat chunk carries the role
            yield _event(shape.chunk(None, first=True))
        while not isinstance(piece, Finished):
            yield _event(shape.chunk(piece))
            sent += 1
            piece = await _next_piece(pieces)
        yield _event(shape.chunk(None, finish_reason=piece.reason))
        if include_usage:
            yield _event(shape.usage_chunk(prompt_tokens, piece.completion_tokens))
        yield b"data: [DONE]\n\n"
        done = True
    except ApiError as e:  # the status line is gone; say it in the stream, as OpenAI does
        yield _event(e.body())
        done = True
    finally:
        cancel.set()
        if not done:
            logger.info(
                "%s: the client left after %d chunks; generation stopped, session closed", shape.id, sent
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--initial-peers", nargs="+", help="multiaddrs of swarm members")
    where.add_argument("--public", action="store_true", help="use the public swarm")
    parser.add_argument(
        "--model", required=True, help="the model's checkpoint directory (config, tokenizer, embeddings)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("HEXSWARM_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $HEXSWARM_API_KEY, else none)",
    )
    parser.add_argument(
        "--served-model-name", default=None, help="the model name clients use (default: the directory's name)"
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
    from swarm.dht import quiet_hivemind

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_hivemind()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = DistributedModelForCausalLM.from_pretrained(
        args.model,
        initial_peers=args.initial_peers,
        public=args.public,
        routing=args.routing,
        coverage_timeout=args.coverage_timeout,
    )
    name = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    config = ApiConfig(name=name, api_key=args.api_key or None, max_concurrent=args.max_concurrent)
    ready = f"api: serving {name} at http://{args.host}:{args.port}/v1"
    app = create_app(model, tokenizer, config, on_ready=lambda: print(ready, flush=True))
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        model.shutdown()
    return 0
