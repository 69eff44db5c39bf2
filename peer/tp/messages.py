"""What a tensor-parallel group's leader and its other ranks tell each other, and the pipes it
travels over.

Ranks 1..K-1 are child processes of the leader (rank 0), each with one pipe to it: the leader
sends commands in order, the rank answers with replies and heartbeats. These are plain frozen
dataclasses between our own processes on one machine, never the network; a rank's
`RankSetup` crosses the same boundary once, as the argument its process is spawned with.
Tensors never travel here: a step's hidden states are broadcast (peer/tp/collectives.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the messages themselves load no torch
    import torch

    from hexswarm.peer.tp.shard import Partition, Sessions
    from hexswarm.swarm.trust.records import DeviceInfo


@dataclass(frozen=True)
class Slowdown:
    """Benchmark-only: this rank computes `factor` times slower from `after_s` seconds on."""

    factor: float
    after_s: float = 0.0


@dataclass(frozen=True)
class RankSetup:
    """Everything a rank process needs to join its group and load its shard."""

    rank: int
    tp: int  # ranks in the group (the first stack's degree)
    device: str
    model_dir: str
    start: int
    end: int
    dtype: torch.dtype
    init_method: str  # tcp://127.0.0.1:PORT, where rank 0 hosts the rendezvous
    timeout_s: float  # bound on every collective
    threads: int | None  # CPU threads of this rank (None: torch's default)
    degrees: tuple[int, ...]  # degrees the group may serve at (sub-groups built at start)
    log_format: str
    log_level: int
    quant: str = "none"  # the weight format every rank's shard is quantized to (peer/quant.py)
    partition: str = "even"  # "auto": profile, and load the share Hepti's LP gives (tp/profile.py)
    slowdown: Slowdown | None = None  # benchmark-only: this rank computes slower (tp/profile.py)


# Commands, from the leader to a rank.
@dataclass(frozen=True)
class OpenCache:
    session_id: str
    stack_id: int = 0  # which of the rank's stacks the session runs on (0: the one it started with)


@dataclass(frozen=True)
class FreeCache:
    session_id: str


@dataclass(frozen=True)
class RunStep:
    """Run global blocks [start, end) of a session; the input arrives by broadcast from rank 0."""

    session_id: str
    position: int
    start: int
    end: int
    shape: tuple[int, int, int]  # (batch, new tokens, hidden)
    stack_id: int = 0


@dataclass(frozen=True)
class LoadStack:
    """Load blocks [start, end) at degree `tp` as stack `stack_id` beside the ones serving (a
    move of the peer, or a re-partition); sent to ranks 1..tp-1 only."""

    stack_id: int
    start: int
    end: int
    tp: int
    partition: Partition | None = None  # an uneven split (None: 1/tp each)


@dataclass(frozen=True)
class Resplit:
    """Move every listed session's keys and values from stack `old` to stack `new` (a
    re-partition), then drop `old`: each session is (id, ((local layer, batch, length), ...))."""

    old: int
    new: int
    sessions: Sessions


@dataclass(frozen=True)
class DropStack:
    stack_id: int


@dataclass(frozen=True)
class Stop:
    pass


# Replies, from a rank to the leader.
@dataclass(frozen=True)
class Joining:
    """The rank has started and imported its libraries; it joins the process group next."""

    rank: int


@dataclass(frozen=True)
class Ready:
    rank: int
    pid: int
    device: DeviceInfo


@dataclass(frozen=True)
class Loaded:
    """A `LoadStack` is done on this rank."""

    rank: int
    stack_id: int


@dataclass(frozen=True)
class Heartbeat:
    rank: int


@dataclass(frozen=True)
class StepTimes:
    """A rank's compute over its last decode steps of stack `stack_id` (waits excluded)."""

    rank: int
    stack_id: int
    steps: int
    compute_s: float


@dataclass(frozen=True)
class Failed:
    rank: int
    reason: str


def try_send(conn: Connection, message: object) -> bool:
    """Sends `message`; False if the other end is gone (the caller decides what that means)."""
    try:
        conn.send(message)
        return True
    except (OSError, ValueError):
        return False


class RankPipes:
    """The leader's ends of the ranks' pipes: commands leave in one order, whichever thread
    sends them, and replies are read as they come."""

    def __init__(self):
        self.conns: dict[int, Connection] = {}  # rank (1..K-1) -> the leader's end
        self._send_lock = threading.Lock()

    def add(self, rank: int, conn: Connection) -> None:
        self.conns[rank] = conn

    def send(self, ranks: Iterable[int], message: object) -> None:
        """Sends `message` to each of `ranks`; OSError or ValueError if a pipe is broken."""
        with self._send_lock:
            for rank in ranks:
                self.conns[rank].send(message)

    def drain(self, rank: int, receive: Callable[[int, object], None]) -> None:
        """Hands every message `rank` has sent so far to `receive`, in order."""
        conn = self.conns[rank]
        try:
            while conn.poll():
                receive(rank, conn.recv())
        except (EOFError, OSError):
            pass  # the process is gone; its exit code tells the rest
