"""An OpenAI-compatible HTTP API over the swarm (FastAPI; `hexswarm api` runs it with uvicorn).

Serves `/v1/models`, `/v1/completions` and `/v1/chat/completions` for one model, whose
transformer layers run in the swarm. Each request runs `generate()` in a worker thread with
its own swarm session (client/api_generation.py); streamed answers are server-sent events.
When a client disconnects mid-stream, its generation stops after the step in flight and its
session is closed on every peer.
"""

from __future__ import annotations

import contextlib
import json
import logging
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


class ApiService:
    """Serves requests for one model: checks them, starts their generation, shapes the answer."""

    def __init__(self, model, tokenizer, config: ApiConfig):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.executor = ThreadPoolExecutor(config.max_concurrent, thread_name_prefix="api-generate")
        self.context = getattr(model.config, "max_position_embeddings", None)
        self.names = served_names(config.name, getattr(getattr(model, "spec", None), "model_id", None))
        self.started = int(time.time())
        if tokenizer.chat_template is None:
            logger.warning(
                "the tokenizer has no chat template; chat requests use a plain 'role: content' one"
            )
            tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
        eos = model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    def check_key(self, request: Request) -> None:
        if not self.config.api_key:  # no key (or an empty one) set: the API is open
            return
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not secrets.compare_digest(given.encode(), self.config.api_key.encode()):
            raise ApiError(401, "missing or wrong API key", "invalid_request_error", code="invalid_api_key")

    def models(self) -> dict:
        entry = {"id": self.config.name, "object": "model", "created": self.started, "owned_by": "hexswarm"}
        return {"object": "list", "data": [entry]}

    def chat_ids(self, body: ChatRequest) -> list[int]:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:  # e.g. a template that refuses a system message
            raise bad_request(f"the model's chat template refused these messages: {e}", "messages") from None
        return self.tokenizer(text, add_special_tokens=False).input_ids

    async def serve(self, body: CompletionRequest | ChatRequest, ids: list[int], chat: bool):
        """The whole answer, or a stream of server-sent events; ApiError for anything refused."""
        max_tokens, stop = self._check(body, ids, chat)
        settings = SamplingSettings(max_tokens, body.temperature, body.top_p, body.seed, body.ignore_eos)
        stream = start_generation(self.model, self.executor, torch.tensor([ids]), settings)
        eos_ids = set() if body.ignore_eos else self.eos_ids
        pieces = text_deltas(stream, TextAssembler(self.tokenizer, stop), max_tokens, eos_ids)
        shape = ResponseShape(chat, self.config.name)
        try:
            first = await _next_piece(pieces)  # errors before the first token get their HTTP status
        except BaseException:
            stream.cancel.set()
            raise
        if not body.stream:
            return await _whole(first, pieces, shape, len(ids), stream.cancel)
        events = _sse(first, pieces, shape, len(ids), body.include_usage_in_stream(), stream.cancel)
        return StreamingResponse(events, media_type="text/event-stream")

    def _check(self, body, ids: list[int], chat: bool) -> tuple[int, list[str]]:
        """(max_tokens, stop strings) of a request that can be served; ApiError otherwise."""
        body.check_supported()
        if body.model not in self.names:
            message = f"model {body.model!r} is not served here; try {self.config.name!r}"
            raise ApiError(404, message, "invalid_request_error", code="model_not_found", param="model")
        if not ids:
            raise bad_request("the prompt is empty", "prompt")
        max_tokens = _max_tokens(body, chat, self.config)
        if self.context is not None and len(ids) + max_tokens > self.context:
            raise bad_request(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's context "
                f"of {self.context}",
                "max_tokens",
            )
        return max_tokens, body.stop_strings()


def create_app(model, tokenizer, config: ApiConfig, on_ready=None) -> FastAPI:
    """The FastAPI app serving `model` (a DistributedModelForCausalLM, or any HF causal LM);
    `on_ready()` is called once the app starts."""
    service = ApiService(model, tokenizer, config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if on_ready is not None:
            on_ready()
        yield
        service.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="hexswarm OpenAI-compatible API", lifespan=lifespan)
    _add_error_handlers(app)
    keyed = [Depends(service.check_key)]

    @app.get("/v1/models", dependencies=keyed)
    async def models() -> dict:
        return service.models()

    @app.post("/v1/completions", dependencies=keyed)
    async def completions(body: CompletionRequest):
        return await service.serve(body, _completion_ids(tokenizer, body.prompt), chat=False)

    @app.post("/v1/chat/completions", dependencies=keyed)
    async def chat_completions(body: ChatRequest):
        return await service.serve(body, service.chat_ids(body), chat=True)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape, including FastAPI's own 422 (answered as 400, as OpenAI does)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        _log_refusal(request, error)
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        refused = bad_request(f"{where or 'body'}: {first.get('msg', 'invalid request')}", where)
        _log_refusal(request, refused)
        return JSONResponse(refused.body(), status_code=refused.status)


def _log_refusal(request: Request, error: ApiError) -> None:
    """Every 4xx and 5xx answer, with its reason, in the API's log."""
    log = logger.error if error.status >= 500 else logger.warning
    log("%s %s -> %d %s", request.method, request.url.path, error.status, error.message)


def served_names(name: str, model_id: str | None) -> set[str]:
    """The names a request may use: the served name, and the swarm's model id (what `hexswarm
    status` shows, `smollm2-135M-b83433b02745`) with or without its fingerprint."""
    names = {name}
    if model_id:
        names |= {model_id, model_id.rsplit("-", 1)[0]}
    return names


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
    except Exception as e:  # what generate() raised, in the worker thread
        raise _as_api_error(e) from None


def _as_api_error(error: Exception) -> ApiError:
    """What generate() raised, as the HTTP error a client should see."""
    if isinstance(error, MissingBlocksError):
        return ApiError(503, str(error), "service_unavailable", code="missing_blocks")
    if isinstance(error, PeerError):
        return ApiError(503, str(error), "service_unavailable", code="peer_error")
    if isinstance(error, ValueError | NotImplementedError):
        return bad_request(str(error))
    logger.error("generation failed", exc_info=error)
    return ApiError(500, f"generation failed: {error}", "server_error")


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
        logger.warning("%s: failed after %d chunks: %d %s", shape.id, sent, e.status, e.message)
        yield _event(e.body())
        done = True
    finally:
        cancel.set()
        if not done:
            logger.info(
                "%s: the client left after %d chunks; generation stopped, session closed", shape.id, sent
            )
