"""run_sync: a sync caller waits on the client loop, bounded by a timeout or its cancel event."""

import asyncio
import threading
import time

import pytest

from hexswarm.client.worker import Cancelled, run_sync


async def _sleeps(seconds: float, ended: list) -> str:
    try:
        await asyncio.sleep(seconds)
        return "done"
    except asyncio.CancelledError:
        ended.append("cancelled")
        raise


def test_result_comes_back():
    assert run_sync(_sleeps(0.01, []), timeout=5, cancel=threading.Event()) == "done"


def test_cancel_stops_the_wait_and_the_coroutine():
    cancel, ended = threading.Event(), []
    threading.Timer(0.2, cancel.set).start()
    began = time.monotonic()
    with pytest.raises(Cancelled):
        run_sync(_sleeps(30, ended), timeout=60, cancel=cancel)
    assert time.monotonic() - began < 2
    time.sleep(0.2)  # the loop thread delivers the cancellation
    assert ended == ["cancelled"]


def test_timeout_still_applies_with_a_cancel_event():
    ended = []
    with pytest.raises(TimeoutError):
        run_sync(_sleeps(30, ended), timeout=0.3, cancel=threading.Event())
    time.sleep(0.2)
    assert ended == ["cancelled"]


def test_the_coroutines_own_timeout_error_is_not_a_wait():
    async def times_out():
        raise TimeoutError("inner")

    began = time.monotonic()
    with pytest.raises(TimeoutError, match="inner"):
        run_sync(times_out(), timeout=30, cancel=threading.Event())
    assert time.monotonic() - began < 2
