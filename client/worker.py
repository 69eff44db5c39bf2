"""One background event loop per client process, so sync code (HF generate) can call async I/O."""

from __future__ import annotations

import asyncio
import threading
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


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Runs `coro` on the client loop and waits for its result (cancels it on timeout)."""
    future = asyncio.run_coroutine_threadsafe(coro, event_loop())
    try:
        return future.result(timeout)
    except TimeoutError:
        future.cancel()
        raise
