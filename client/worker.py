"""One background event loop per client process, so sync code (HF generate) can call async I/O."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """The client's event loop, started on first use in a daemon thread."""
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="hexswarm-client-loop", daemon=True).start()
        return _loop


class Cancelled(Exception):
    """The caller's `cancel` event was set while `run_sync` waited (the coroutine is cancelled)."""


CANCEL_POLL_S = 0.1  # how often a waiting caller looks at its cancel event


def run_sync(
    coro: Coroutine[Any, Any, T], timeout: float | None = None, cancel: threading.Event | None = None
) -> T:
    """Runs `coro` on the client loop and waits for its result; cancels it on timeout (raising
    TimeoutError) or, within CANCEL_POLL_S, once `cancel` is set (raising Cancelled)."""
    future = asyncio.run_coroutine_threadsafe(coro, event_loop())
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if cancel is not None:
            wait = CANCEL_POLL_S if wait is None else min(wait, CANCEL_POLL_S)
        try:
            return future.result(wait)
        except TimeoutError:
            if future.done():  # the coroutine's own TimeoutError
                raise
            if deadline is not None and time.monotonic() >= deadline:
                future.cancel()
                raise
            if cancel is not None and cancel.is_set():
                future.cancel()
                raise Cancelled("cancelled by the caller") from None
