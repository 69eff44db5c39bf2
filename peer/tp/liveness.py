"""Whether a tensor-parallel group's processes are alive, watched both ways.

A rank that hangs (a stopped process, a deadlocked kernel) sends nothing, and a rank whose
leader died would otherwise hold its device forever. So:

- each rank sends a heartbeat every HEARTBEAT_S over its pipe (`send_heartbeats`); the leader
  notes when it last heard from each rank (`Liveness`) and fails the group (peer/tp/failure.py)
  when a rank's process has exited, or when a rank that was ready has been silent `timeout_s`;
- a rank dies with its leader: Linux kills it when the leader dies, however it dies
  (`die_with_parent`), and its command loop also checks its parent's pid every HEARTBEAT_S
  (peer/tp/rank.py) for the platforms without that.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from hexswarm.peer.tp.failure import dead_rank
from hexswarm.peer.tp.messages import Heartbeat, try_send

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0


def send_heartbeats(conn: Connection, rank: int, lock: threading.Lock) -> None:
    """A rank's heartbeats to its leader, every HEARTBEAT_S until the pipe breaks (run it in a
    thread; `lock` keeps them apart from the rank's other replies)."""
    stopped = threading.Event()
    while not stopped.wait(HEARTBEAT_S):
        with lock:
            if not try_send(conn, Heartbeat(rank)):
                return


def die_with_parent() -> None:
    """Asks Linux to SIGKILL this rank when the leader dies, however it dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        logger.debug("prctl unavailable; relying on the pipe and parent checks")


class Liveness:
    """The leader's watch on ranks 1..K-1: when it last heard from each, and which has failed."""

    def __init__(self, procs: dict[int, BaseProcess], timeout_s: float):
        self._procs = procs  # ranks 1..K-1 (the group fills it as it spawns them)
        self._timeout_s = timeout_s
        self._last_seen: dict[int, float] = {}  # rank -> time.monotonic() of its last message

    def heard(self, rank: int) -> None:
        """`rank` sent a message (any message counts as a heartbeat)."""
        self._last_seen[rank] = time.monotonic()

    def failure(self, rank: int, ready: bool) -> str | None:
        """Why the group fails because of `rank`, if it does: a rank's process has exited, or
        `rank` finished loading (`ready`) and has been silent for `timeout_s` since."""
        silent = time.monotonic() - self._last_seen.get(rank, time.monotonic())
        if self._procs[rank].exitcode is not None:
            return dead_rank(self._procs, 0)
        if ready and silent > self._timeout_s:
            return f"tensor-parallel rank {rank} sent no heartbeat for {silent:.0f} s (hung?)"
        return None
