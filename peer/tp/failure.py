"""How a tensor-parallel group fails: all at once, and once.

A group whose rank exits, stops sending heartbeats (peer/tp/liveness.py) or breaks a collective
(each one times out, peer/tp/collectives.py) cannot serve any more: the other ranks hold shards
nobody can complete. So the first failure kills every rank, which also unblocks a collective
the leader is waiting in, and tells the peer (`on_failure`), after which every request is
answered with PEER_FAILED and the peer leaves (peer/runtime.py). Later failures, and any during
a stop the leader asked for, change nothing.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess

logger = logging.getLogger(__name__)


class GroupFailure:
    """The group's first failure: recorded once, every rank killed, the peer told."""

    def __init__(
        self, procs: dict[int, BaseProcess], on_failure: Callable[[str], None], stopping: threading.Event
    ):
        self.reason: str | None = None
        self._procs = procs  # ranks 1..K-1 (the group fills it as it spawns them)
        self._on_failure = on_failure
        self._stopping = stopping  # set once the leader stops the group on purpose
        self._lock = threading.Lock()

    def fail(self, reason: str) -> None:
        """Fails the group once: kills every rank and tells the peer."""
        with self._lock:
            if self.reason is not None or self._stopping.is_set():
                return
            self.reason = reason
        logger.error("%s; stopping the group", reason)
        for proc in self._procs.values():
            if proc.exitcode is None:
                proc.kill()
        self._on_failure(reason)


def dead_rank(procs: dict[int, BaseProcess], wait_s: float = 1.0) -> str | None:
    """Which rank died, if one did within `wait_s` (a broken collective is usually why)."""
    deadline = time.monotonic() + wait_s
    while True:
        for rank, proc in procs.items():
            if proc.exitcode is not None:
                return f"tensor-parallel rank {rank} (pid {proc.pid}) {exit_reason(proc.exitcode)}"
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def exit_reason(code: int) -> str:
    """'was killed by SIGKILL' or 'exited with code 1', for a process's exit code."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"
