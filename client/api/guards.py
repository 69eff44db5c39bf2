"""HTTP guards of the API: a request-body limit, cancelling the work of a client that left, and
a cached health check of the swarm's coverage.

Each answers a way one client could make the server work for nothing: a body of any size read
whole into memory, a generation that runs to `max_tokens` for nobody, and an unauthenticated
health probe that reads the DHT on every call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hexswarm.client.api.schema import ApiError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# nginx's status for "the client closed the request": logged, never seen by the client (it left).
CLIENT_CLOSED_REQUEST = 499


def body_too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than this server accepts ({max_bytes} bytes)",
        "invalid_request_error",
        code="request_too_large",
        headers={"Connection": "close"},  # the rest of the body is never read
    )


class BodyTooLarge(HTTPException):
    """Raised while a chunked body is read past the limit. An HTTPException, because FastAPI
    answers any other error raised while reading a body as a 400."""

    def __init__(self, max_bytes: int):
        self.error = body_too_large(max_bytes)
        super().__init__(self.error.status, self.error.message, headers=self.error.headers)


class BodyLimit:
    """ASGI middleware: 413 for a request body over `max_bytes`, before the body is read whole.

    A declared Content-Length over the limit is answered before any of the body is read, and the
    connection is closed so that the rest never is; a body without a length (chunked) is counted
    as it arrives and refused once it passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            error = body_too_large(self.max_bytes)
            logger.warning("%s %s -> 413 a body of %d bytes", scope["method"], scope["path"], declared)
            response = JSONResponse(error.body(), status_code=error.status, headers=error.headers)
            await response(scope, receive, send)
            return
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server itself refuses a malformed length
    return None


async def unless_client_leaves(request: Request, work: Coroutine[Any, Any, T]) -> T | Response:
    """Runs `work`, and cancels it if the client disconnects first (as vLLM's `with_cancellation`
    does): a queued request then leaves the queue without running, and a running one stops
    generating. A streamed answer is past this point once its first token is out; Starlette's
    StreamingResponse then watches for the disconnect itself."""
    task = asyncio.create_task(work)
    watcher = asyncio.create_task(_client_left(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()  # the client left first
    outcome = (await asyncio.gather(task, return_exceptions=True))[0]
    if isinstance(outcome, Exception):
        logger.warning("after its client left, a request's cleanup failed", exc_info=outcome)
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _client_left(request: Request) -> None:
    """Returns when the client disconnects. The body has been read whole by now, so the only
    message left to receive is the disconnect."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class CoverageProbe:
    """Which blocks of the model no online peer serves, for `GET /health`.

    `/health` needs no key, so it must not let anyone make the server read the DHT at will: one
    check runs at a time, its answer is reused for `ttl_s`, and a check that takes longer than
    `timeout_s` reads as "unknown" (None)."""

    def __init__(self, missing_blocks: Callable[[], list[int]], ttl_s: float = 2.0, timeout_s: float = 5.0):
        self.missing_blocks, self.ttl_s, self.timeout_s = missing_blocks, ttl_s, timeout_s
        self._answer: tuple[float, list[int] | None] | None = None  # (monotonic time, answer)
        self._check: asyncio.Task | None = None  # the one check in flight, owned here

    @property
    def answered(self) -> bool:
        """Whether any check has finished yet."""
        return self._answer is not None

    def start(self) -> None:
        """Starts the first check now (on the running loop), without waiting for it."""
        if self._check is None and self._answer is None:
            self._check = asyncio.create_task(self._run_check())

    async def missing(self) -> list[int] | None:
        """The uncovered blocks ([] when every block is served); None when the check failed."""
        if self._answer is not None and time.monotonic() - self._answer[0] < self.ttl_s:
            return self._answer[1]
        if self._check is None:
            self._check = asyncio.create_task(self._run_check())
        try:
            async with asyncio.timeout(self.timeout_s):
                return await asyncio.shield(self._check)
        except TimeoutError:
            if self._answer is not None:  # not the first: a slow read is worth a line
                logger.warning("health: the coverage check took over %g s", self.timeout_s)
            return None

    async def _run_check(self) -> list[int] | None:
        try:
            answer = await asyncio.to_thread(self.missing_blocks)
        except Exception:
            logger.exception("health: the coverage check failed")
            answer = None
        self._answer, self._check = (time.monotonic(), answer), None
        return answer
