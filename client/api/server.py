"""An OpenAI-compatible HTTP API over the swarm (FastAPI; `hexswarm api` runs it with uvicorn).

Serves `/v1/models`, `/v1/completions` and `/v1/chat/completions` for one model, whose
transformer layers run in the swarm, and `GET /health`. A request first takes a place in a
bounded queue (client/api/admission.py: 429 with Retry-After, at once, when it is full), is
checked and tokenized off the event loop, then runs `generate()` in a worker thread with its
own swarm session (client/api/generation.py); streamed answers are server-sent events.
When a client disconnects, its request is cancelled wherever it is: a queued one never
starts, and a running one stops after the step in flight, its session closed on every peer.
A body over the limit gets 413 before it is read whole (client/api/guards.py).

Only a request that cannot be served as asked gets a 4xx. What fails inside (a bug, a
`ValueError` from routing or the client library) is a 500 with its traceback in the log, and
a swarm that cannot serve right now is a 503: neither is the client's fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import jinja2
import torch
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hexswarm.client.api.admission import Admission, AdmissionLimits, Ticket
from hexswarm.client.api.answer_report import AnswerTiming, final_extension, live_extension, with_extension
from hexswarm.client.api.chat_page import chat_page
from hexswarm.client.api.generation import GenerationHooks, SamplingSettings, TokenStream, start_generation
from hexswarm.client.api.guards import BodyLimit, BodyTooLarge, CoverageProbe, unless_client_leaves
from hexswarm.client.api.schema import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    ApiError,
    ChatRequest,
    CompletionRequest,
    ResponseShape,
    bad_request,
)
from hexswarm.client.api.text import Finished, TextAssembler, text_deltas
from hexswarm.client.remote import PeerError
from hexswarm.client.session import SequenceTooLongError
from hexswarm.client.swarm_client import MissingBlocksError, uncovered_blocks
from hexswarm.client.verify_records import UnsettledDisputeError
from hexswarm.swarm.trust.records import block_ranges

logger = logging.getLogger(__name__)

DEFAULT_CHAT_MAX_TOKENS = (
    256  # OpenAI's default is "the rest of the context"; that would reserve huge sessions
)
# 1 MiB holds a prompt of ~250k tokens as text, or a 128k-token context as a list of token ids;
# TGI's default payload limit is 2 MB.
DEFAULT_MAX_BODY_BYTES = 1 << 20
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@dataclass
class ApiConfig:
    """What one server serves and how."""

    name: str  # the model name clients pass ("model": ...)
    api_key: str | None = None
    limits: AdmissionLimits = field(default_factory=AdmissionLimits)  # running, queued, queue wait
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get 413
    default_chat_max_tokens: int = DEFAULT_CHAT_MAX_TOKENS


class ApiService:
    """Serves requests for one model: checks them, starts their generation, shapes the answer."""

    def __init__(self, model, tokenizer, config: ApiConfig):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        # One thread per run slot: a request holds its slot until its thread is done, so no
        # generation ever waits in the executor's own (unbounded) queue.
        self.executor = ThreadPoolExecutor(config.limits.max_running, thread_name_prefix="api-generate")
        self.admission = Admission(config.limits)
        self.coverage = CoverageProbe(uncovered_blocks_of(model))
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

    async def health(self) -> JSONResponse:
        """200 while every block of the model has an online peer, else 503 saying why; with the
        load (generating, queued), as a load balancer or an operator wants it."""
        missing = await self.coverage.missing()
        load = {"generating": self.admission.running, "queued": self.admission.queued}
        if missing == []:
            return JSONResponse({"status": "ok", **load})
        if missing is None and not self.coverage.answered:
            reason = "starting: the first read of the swarm's coverage has not finished yet"
        elif missing is None:
            reason = "the swarm's coverage could not be read in time (the API's log says why)"
        else:
            reason = f"no online peer serves blocks {block_ranges(missing)} of the model"
        return JSONResponse({"status": "unavailable", "reason": reason, **load}, status_code=503)

    async def answer(self, request: Request, body: CompletionRequest | ChatRequest, chat: bool):
        """The answer to one request (see `_serve`); a bare 499 if its client left first."""
        timing = AnswerTiming(time.monotonic())
        # 429 at once when every place is taken, or this client (its address) holds its share
        ticket = self.admission.admit(request.client.host if request.client else "")
        return await unless_client_leaves(request, self._serve(ticket, body, chat, timing))

    async def _serve(
        self, ticket: Ticket, body: CompletionRequest | ChatRequest, chat: bool, timing: AnswerTiming
    ):
        """The whole answer, or a stream of server-sent events; ApiError for anything refused."""
        try:
            ids, max_tokens, stop = await self._prepare(body, chat)
            await ticket.wait_turn()
        except BaseException as e:
            ticket.done()
            if isinstance(e, asyncio.CancelledError):
                logger.info("a queued request was cancelled before it ran (its client left)")
            raise
        settings = SamplingSettings(
            max_tokens, body.temperature, body.top_p, body.seed, body.ignore_eos, body.speculate
        )
        assembler = TextAssembler(self.tokenizer, stop)
        hooks = GenerationHooks(assembler.delta, lambda: assembler.stopped, ticket.done)
        try:
            stream = start_generation(self.model, self.executor, torch.tensor([ids]), settings, hooks)
        except BaseException:
            ticket.done()  # no thread took the request, so none will hand its slot back
            raise
        eos_ids = set() if body.ignore_eos else self.eos_ids
        pieces = text_deltas(stream, assembler, max_tokens, eos_ids)
        shape = ResponseShape(chat, self.config.name)
        try:
            first = await _next_piece(pieces)  # errors before the first token get their HTTP status
        except BaseException:
            stream.cancel.set()
            raise
        if not isinstance(first, Finished):
            timing.first_token_now()
        answer = _Answer(first, pieces, shape, len(ids), stream, timing)
        if not body.stream:
            return await _whole(answer)
        events = _sse(answer, body.include_usage_in_stream())
        return StreamingResponse(events, media_type="text/event-stream")

    async def _prepare(self, body, chat: bool) -> tuple[list[int], int, list[str]]:
        """(prompt ids, max_tokens, stop strings) of a request that can be served; ApiError
        otherwise. The checks that need no tokens come first; templating and tokenizing, which
        take ~1 s of CPU for a 1 MiB prompt, run in a thread so the event loop stays free."""
        body.check_supported()
        stop = body.stop_strings()
        if body.model not in self.names:
            message = f"model {body.model!r} is not served here; try {self.config.name!r}"
            raise ApiError(404, message, "invalid_request_error", code="model_not_found", param="model")
        ids = await asyncio.to_thread(self._chat_ids if chat else self._completion_ids, body)
        if not ids:
            raise bad_request("the prompt is empty", "prompt")
        max_tokens = _max_tokens(body, chat, self.config)
        if self.context is not None and len(ids) >= self.context:
            raise bad_request(
                f"the prompt is {len(ids):,} tokens, and the model's context is {self.context:,}: "
                f"shorten the prompt to at most {self.context - 1:,} tokens",
                "messages" if chat else "prompt",
            )
        if self.context is not None and len(ids) + max_tokens > self.context:
            raise bad_request(
                f"prompt ({len(ids):,} tokens) + max_tokens ({max_tokens:,}) exceeds the model's context "
                f"of {self.context:,}: ask for at most {self.context - len(ids):,} tokens",
                "max_tokens",
            )
        return ids, max_tokens, stop

    def _chat_ids(self, body: ChatRequest) -> list[int]:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except jinja2.TemplateError as e:  # e.g. a template that refuses a system message
            raise bad_request(f"the model's chat template refused these messages: {e}", "messages") from None
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _completion_ids(self, body: CompletionRequest) -> list[int]:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            vocabulary = len(self.tokenizer)
            if any(not 0 <= t < vocabulary for t in prompt):
                raise bad_request("prompt token ids must be in the vocabulary", "prompt")
            return list(prompt)
        text = prompt[0] if isinstance(prompt, list) and prompt else prompt
        return self.tokenizer(text or "").input_ids


def create_app(model, tokenizer, config: ApiConfig) -> FastAPI:
    """The FastAPI app serving `model` (a DistributedModelForCausalLM, or any HF causal LM)."""
    service = ApiService(model, tokenizer, config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        service.coverage.start()  # so that the first /health finds an answer, not a slow read
        yield
        service.executor.shutdown(wait=False, cancel_futures=True)

    # With a key set, the interactive docs are off (a browser cannot send the key, so they
    # could not load the schema anyway) and the schema is served behind the key.
    docs_open = not config.api_key
    app = FastAPI(
        title="hexswarm OpenAI-compatible API",
        lifespan=lifespan,
        docs_url="/docs" if docs_open else None,
        redoc_url="/redoc" if docs_open else None,
        openapi_url="/openapi.json" if docs_open else None,
    )
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    _add_error_handlers(app)
    keyed = [Depends(service.check_key)]

    if not docs_open:

        @app.get("/openapi.json", dependencies=keyed, include_in_schema=False)
        async def openapi() -> dict:
            return app.openapi()

    @app.get("/", include_in_schema=False)  # no key: the page asks for it, and sends it with each request
    async def page() -> HTMLResponse:
        return chat_page()

    @app.get("/health")  # no key: load balancers and probes ask it
    async def health() -> JSONResponse:
        return await service.health()

    @app.get("/v1/models", dependencies=keyed)
    async def models() -> dict:
        return service.models()

    @app.post("/v1/completions", dependencies=keyed)
    async def completions(body: CompletionRequest, request: Request):
        return await service.answer(request, body, chat=False)

    @app.post("/v1/chat/completions", dependencies=keyed)
    async def chat_completions(body: ChatRequest, request: Request):
        return await service.answer(request, body, chat=True)

    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape, including FastAPI's own 422 (answered as 400, as OpenAI does)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        _log_refusal(request, error)
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(StarletteHTTPException)  # unknown paths and methods; a body too large
    async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if isinstance(error, BodyTooLarge):
            shaped = error.error
        else:
            kind = "invalid_request_error" if error.status_code < 500 else "server_error"
            shaped = ApiError(error.status_code, str(error.detail), kind, headers=error.headers)
        _log_refusal(request, shaped)
        return JSONResponse(shaped.body(), status_code=shaped.status, headers=shaped.headers)

    @app.exception_handler(Exception)  # a bug: the server logs the traceback after this answer
    async def _internal(request: Request, error: Exception) -> JSONResponse:
        shaped = _internal_error(error)
        _log_refusal(request, shaped)
        return JSONResponse(shaped.body(), status_code=shaped.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        refused = _validation_error(request, error.errors())
        _log_refusal(request, refused)
        return JSONResponse(refused.body(), status_code=refused.status)


def _validation_error(request: Request, errors) -> ApiError:
    """A 400 in words for FastAPI's validation errors: a body that is not JSON, or not sent as
    JSON, is said so (not as pydantic's dump of it), else the first field at fault."""
    first = errors[0] if errors else {}
    content_type = request.headers.get("content-type", "")
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return bad_request(f"the body is not valid JSON{f' ({detail})' if detail else ''}", None)
    if (
        "json" not in content_type.lower()
        and first.get("loc", ())[:1] == ("body",)
        and len(first.get("loc", ())) <= 1
    ):
        shown = content_type or "none"
        return bad_request(
            f"send the body as JSON, with Content-Type: application/json (it came as {shown})", None
        )
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    return bad_request(f"{where or 'body'}: {first.get('msg', 'invalid request')}", where)


def _log_refusal(request: Request, error: ApiError) -> None:
    """Every 4xx and 5xx answer, with its reason, in the API's log."""
    log = logger.error if error.status >= 500 else logger.warning
    log("%s %s -> %d %s", request.method, request.url.path, error.status, error.message)


def served_names(name: str, model_id: str | None) -> set[str]:
    """The names a request may use: the served name, and the swarm's model id (what `hexswarm
    status` shows, `smollm2-135M-b83433b02745c1d9`) with or without its content hash."""
    names = {name}
    if model_id:
        names |= {model_id, model_id.rsplit("-", 1)[0]}
    return names


def uncovered_blocks_of(model) -> Callable[[], list[int]]:
    """A check of which blocks no online peer serves (it reads the DHT); for a local model, none."""
    swarm, spec = getattr(model, "swarm", None), getattr(model, "spec", None)
    if swarm is None or spec is None:
        return lambda: []
    return lambda: uncovered_blocks(swarm.online_records(spec.model_id, spec.num_blocks), spec.num_blocks)


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
    """What generate() raised, as the HTTP error a client should see. Only a request the swarm
    cannot serve as asked is the client's error; any other ValueError is ours (a 500)."""
    if isinstance(error, SequenceTooLongError):  # longer than the peers' --max-length
        return bad_request(str(error), "max_tokens")
    if isinstance(error, MissingBlocksError):
        return ApiError(503, str(error), "service_unavailable", code="missing_blocks")
    if isinstance(error, PeerError):
        return ApiError(503, str(error), "service_unavailable", code="peer_error")
    if isinstance(error, UnsettledDisputeError):  # not the client's fault; another chain may settle it
        return ApiError(503, str(error), "service_unavailable", code="unsettled_dispute")
    logger.error("generation failed", exc_info=error)
    return _internal_error(error)


def _internal_error(error: Exception) -> ApiError:
    """A 500 that names the error's type only: its message may carry internals (peer ids,
    paths) that the client has no use for; the log has the whole traceback."""
    message = f"internal error ({type(error).__name__}); the API's log has the details"
    return ApiError(500, message, "server_error")


@dataclass
class _Answer:
    """One admitted request's generation while its response is written."""

    first: str | Finished  # the first piece, already awaited (errors before it got their status)
    pieces: AsyncIterator  # the rest: text deltas, then one Finished
    shape: ResponseShape
    prompt_tokens: int
    stream: TokenStream  # its cancel stops the generation; its route is the chain so far
    timing: AnswerTiming

    async def next_piece(self) -> str | Finished:
        return await _next_piece(self.pieces)


async def _whole(answer: _Answer) -> dict:
    text, piece, shape = [], answer.first, answer.shape
    try:
        while not isinstance(piece, Finished):
            text.append(piece)
            piece = await answer.next_piece()
    except asyncio.CancelledError:
        logger.info("%s: the client left; generation stopped, session closed", shape.id)
        raise
    finally:
        answer.stream.cancel.set()  # a no-op once generation ended; stops it if this handler was cancelled
    body = shape.whole("".join(text), piece.reason, answer.prompt_tokens, piece.completion_tokens)
    return with_extension(body, final_extension(piece, answer.timing))


def _event(body: dict) -> bytes:
    return f"data: {json.dumps(body)}\n\n".encode()


async def _sse(answer: _Answer, include_usage: bool):
    """Server-sent events; when the client goes away, closing this generator stops the generation."""
    piece, shape, sent, done = answer.first, answer.shape, 0, False
    live = live_extension(answer.stream.route)  # the chain at the first token, for the first chunk
    try:
        if shape.chat:  # OpenAI's first chat chunk carries the role
            yield _event(with_extension(shape.chunk(None, first=True), live))
            live = None
        while not isinstance(piece, Finished):
            yield _event(with_extension(shape.chunk(piece), live))
            live, sent = None, sent + 1
            piece = await answer.next_piece()
        yield _event(
            with_extension(
                shape.chunk(None, finish_reason=piece.reason), final_extension(piece, answer.timing)
            )
        )
        if include_usage:
            yield _event(shape.usage_chunk(answer.prompt_tokens, piece.completion_tokens))
        yield b"data: [DONE]\n\n"
        done = True
    except ApiError as e:  # the status line is gone; say it in the stream, as OpenAI does
        logger.warning("%s: failed after %d chunks: %d %s", shape.id, sent, e.status, e.message)
        yield _event(e.body())
        done = True
    finally:
        answer.stream.cancel.set()
        if not done:
            logger.info(
                "%s: the client left after %d chunks; generation stopped, session closed", shape.id, sent
            )
