"""Starting and stopping the processes of a tensor-parallel group's ranks 1..K-1.

The leader spawns each rank as a child process (spawned, not forked: a fork would copy the DHT's
threads) with one pipe to it, and waits, with a generous deadline, for the ranks to start, load
their shards, or load a new stack. A stop asks each rank to finish (peer/tp/messages.py `Stop`)
and kills any that has not within STOP_TIMEOUT_S, so a stopped group never leaves a process
behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess

from hexswarm.peer.tp.messages import RankSetup
from hexswarm.peer.tp.rank import rank_main

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0  # loading a large shard from disk may take minutes
STOP_TIMEOUT_S = 10.0


class TPGroupError(RuntimeError):
    """The group could not start."""


def spawn_rank(context: SpawnContext, setup: RankSetup) -> tuple[BaseProcess, Connection]:
    """Starts rank `setup.rank`'s process; returns it and the leader's end of its pipe."""
    parent_end, child_end = context.Pipe()
    proc = context.Process(
        target=rank_main, args=(setup, child_end), name=f"tp-rank-{setup.rank}", daemon=True
    )
    proc.start()
    child_end.close()
    return proc, parent_end


def wait_until(done: Callable[[], bool], what: str, failure: Callable[[], str | None]) -> None:
    """Waits until `done()`; TPGroupError once `failure()` names one, or when the ranks did not
    `what` within STARTUP_TIMEOUT_S."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not done():
        reason = failure()
        if reason is not None:
            raise TPGroupError(reason)
        if time.monotonic() > deadline:
            raise TPGroupError(f"the ranks did not {what} within {STARTUP_TIMEOUT_S:.0f} s")
        time.sleep(0.05)


def stop_processes(procs: Iterable[BaseProcess]) -> None:
    """Waits for `procs` to exit, all within STOP_TIMEOUT_S; kills those that have not."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.exitcode is None:
            logger.warning("rank %s did not stop; killing it", proc.name)
            proc.kill()
            proc.join(5)
