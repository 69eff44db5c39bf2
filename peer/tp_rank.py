"""A tensor-parallel rank other than the leader: its process, its collectives, its loop.

Ranks 1..K-1 of a peer are child processes of the leader (rank 0). The leader talks to each
over a pipe (commands, in order) and to all of them at once over `torch.distributed` (NCCL
on CUDA, gloo on CPU): a step's hidden states are broadcast from rank 0, and every layer
all-reduces its row-parallel outputs. Commands go through the pipe rather than a collective
so that an idle group waits in `poll`, not in a collective that would time out.

A peer whose plan chooses its degree (`--layers auto --tp auto`) starts one rank per offered
device and serves at degree k on ranks 0..k-1: every rank builds the same sub-groups at start
(`subgroups`), each stack of blocks runs on the sub-group of its degree, and a rank outside a
stack's degree gets none of its commands. So a change of degree is a move like any other: the
new stack loads beside the old one on the ranks it needs.

Liveness, both ways: a rank sends a heartbeat every HEARTBEAT_S (the leader declares it hung
after `timeout_s` of silence), and exits when the leader's end of the pipe closes or the
leader process dies (PR_SET_PDEATHSIG on Linux, and a parent-pid check as a fallback).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from hexswarm.peer.tp_profile import Agreed, ComputeClock, Slowdown, agree_partition
from hexswarm.peer.tp_shard import Partition, Sessions, resplit_sessions
from hexswarm.swarm import log_setup
from hexswarm.swarm.records import DeviceInfo

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
REPORT_S = 0.5  # how often a rank reports its decode compute to the leader


# Messages over a rank's pipe (between our own processes on one machine, never the network).
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


# ... and from a rank to the leader.
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
    partition: str = "even"  # "auto": profile, and load the share Hepti's LP gives (tp_profile.py)
    slowdown: Slowdown | None = None  # benchmark-only: this rank computes slower (tp_profile.py)


def join_group(setup: RankSetup) -> None:
    """Joins the group's process group; every collective then times out after `timeout_s`."""
    device = torch.device(setup.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method=setup.init_method,
        rank=setup.rank,
        world_size=setup.tp,
        timeout=timedelta(seconds=setup.timeout_s),
        device_id=device if device.type == "cuda" else None,  # binds NCCL to this rank's GPU
    )


def subgroups(size: int, degrees: tuple[int, ...]) -> dict[int, object]:
    """Degree -> its process group (ranks 0..k-1; None: the whole group). Every rank calls this
    once after joining, with the same arguments: creating a group is collective."""
    groups: dict[int, object] = {size: None}
    for k in sorted(set(degrees)):
        if 1 < k < size:
            groups[k] = dist.new_group(list(range(k)))
    return groups


def all_reduce_over(group) -> Callable[[torch.Tensor], None]:
    """Sums a tensor in place over `group` (the row-parallel layers' partial outputs)."""

    def all_reduce(tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, group=group)

    return all_reduce


def broadcast_from_leader(tensor: torch.Tensor, group=None) -> None:
    dist.broadcast(tensor, src=0, group=group)


def load_shard(
    spec,
    start: int,
    end: int,
    dtype: torch.dtype,
    device,
    rank: int,
    tp: int,
    group,
    quant: str = "none",
    partition: Partition | None = None,
    clock: ComputeClock | None = None,
):
    """This rank's share of blocks [start, end) at degree `tp` (whole blocks at degree 1): 1/tp
    of each layer, or its share of `partition`; linear layers in weight format `quant`; its
    all-reduces timed by `clock`."""
    from hexswarm.peer.blocks import BlockStack
    from hexswarm.peer.tp_shard import ShardPlan

    if tp == 1:
        return BlockStack.load(spec, start, end, dtype, device, quant=quant)
    plan = ShardPlan(spec.config, rank, tp, partition)
    all_reduce = all_reduce_over(group)
    if clock is not None:
        all_reduce = clock.wrap(all_reduce)
    return BlockStack.load(spec, start, end, dtype, device, plan, all_reduce, quant=quant)


def first_partition(setup: RankSetup, device: torch.device, spec, clock: ComputeClock) -> Agreed | None:
    """With `--partition auto`, the split the group agrees on after profiling (collective)."""
    if setup.partition != "auto":
        return None
    return agree_partition(
        setup.rank, setup.tp, device, setup.dtype, spec.config, setup.end - setup.start, setup.quant, clock
    )


def rank_main(setup: RankSetup, conn) -> None:
    """Entry point of rank processes 1..K-1 (spawned by peer/tp_group.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the leader, which stops the group
    _die_with_parent()
    logging.basicConfig(level=setup.log_level, format=setup.log_format, stream=sys.stderr, force=True)
    log_setup.disable_progress()  # the leader draws the group's progress bars
    if setup.threads is not None:
        torch.set_num_threads(setup.threads)
    from hexswarm.peer.devices import describe  # heavy imports after the process is set up
    from hexswarm.swarm.model_spec import load_model_spec

    device = torch.device(setup.device)
    clock = ComputeClock(setup.slowdown)
    conn.send(Joining(setup.rank))
    try:
        join_group(setup)
        groups = subgroups(setup.tp, setup.degrees)
        spec = load_model_spec(setup.model_dir)
        agreed = first_partition(setup, device, spec, clock)
        partition = agreed.partition if agreed else None
        stack = load_shard(
            spec,
            setup.start,
            setup.end,
            setup.dtype,
            device,
            setup.rank,
            setup.tp,
            None,
            setup.quant,
            partition,
            clock,
        )
        conn.send(Ready(setup.rank, os.getpid(), describe(device, setup.threads)))
    except Exception as e:
        logger.exception("rank %d failed to start", setup.rank)
        conn.send(Failed(setup.rank, f"{type(e).__name__}: {e}"))
        sys.exit(1)
    send_lock = threading.Lock()
    threading.Thread(target=_heartbeats, args=(conn, setup.rank, send_lock), daemon=True).start()

    def load(command: LoadStack) -> _Stack:
        group = groups[command.tp]
        blocks = load_shard(
            spec,
            command.start,
            command.end,
            setup.dtype,
            device,
            setup.rank,
            command.tp,
            group,
            setup.quant,
            command.partition,
            clock,
        )
        return _Stack(blocks, group)

    try:
        # only an uneven group's leader reads the ranks' decode times (its drift check)
        observe = setup.partition == "auto"
        _serve(_Stacks(_Stack(stack, None), load, conn, setup.rank, send_lock, clock, observe), conn)
    except Exception as e:  # a failed collective, or the leader gone: the leader tears the group down
        logger.error("rank %d stops: %s: %s", setup.rank, type(e).__name__, e)
        with send_lock:
            _try_send(conn, Failed(setup.rank, f"{type(e).__name__}: {e}"))
        os._exit(1)  # skip interpreter teardown: a broken process group may block it
    dist.destroy_process_group()


@dataclass(frozen=True)
class _Stack:
    blocks: object  # this rank's BlockStack of the stack
    group: object  # the process group of its degree (None: the whole group)


class _Stacks:
    """A rank's block stacks by id (one, or two while the peer moves) and its sessions' caches."""

    def __init__(
        self,
        first: _Stack,
        load,
        conn,
        rank: int,
        send_lock: threading.Lock,
        clock: ComputeClock,
        observe: bool,
    ):
        self.stacks = {0: first}
        self.caches: dict[str, object] = {}  # session id -> its cache
        self._load, self._conn, self._rank, self._send_lock = load, conn, rank, send_lock
        self.clock = clock  # the rank's compute apart from its waits (and its benchmark slowdown)
        self._observe = observe  # report decode compute to the leader
        self._times = _DecodeTimes()

    def open(self, command: OpenCache) -> None:
        blocks = self.stacks[command.stack_id].blocks
        self.caches[command.session_id] = blocks.new_cache(command.session_id)

    def load_in_background(self, command: LoadStack) -> None:
        """Loads while the current stacks keep serving (the leader's steps must not wait)."""
        threading.Thread(target=self._load_stack, args=(command,), name="load-stack", daemon=True).start()

    def _load_stack(self, command: LoadStack) -> None:
        try:
            self.stacks[command.stack_id] = self._load(command)
            reply = Loaded(self._rank, command.stack_id)
        except Exception as e:  # the leader fails the group: its ranks no longer hold the same blocks
            logger.exception("rank %d failed to load [%d:%d)", self._rank, command.start, command.end)
            reply = Failed(self._rank, f"loading [{command.start}:{command.end}): {type(e).__name__}: {e}")
        with self._send_lock:
            _try_send(self._conn, reply)

    def step(self, step: RunStep) -> None:
        stack = self.stacks[step.stack_id]
        hidden = torch.empty(step.shape, dtype=stack.blocks.dtype, device=stack.blocks.device)
        broadcast_from_leader(hidden, stack.group)
        # A session freed while its step was queued at the leader still runs there: join the
        # collectives with a throwaway cache (nobody reads that step's output).
        cache = self.caches.get(step.session_id)
        if cache is None:  # (not `or`: an empty DynamicCache is falsy)
            cache = stack.blocks.new_cache(step.session_id)
        self.clock.begin_step()
        stack.blocks(hidden, cache, step.position, step.start, step.end)
        if self._observe and step.shape[:2] == (1, 1):  # decode steps are what the split is sized for
            report = self._times.add(step.stack_id, self.clock.end_step())
            if report is not None:
                with self._send_lock:
                    _try_send(self._conn, StepTimes(self._rank, *report))

    def resplit(self, command: Resplit) -> None:
        """Moves the sessions' caches to the new stack's split (with every other rank), then
        drops the old stack."""
        old, new = self.stacks[command.old], self.stacks[command.new]
        all_reduce = all_reduce_over(new.group)
        self.caches.update(
            resplit_sessions(old.blocks, new.blocks, command.sessions, self.caches, self._rank, all_reduce)
        )
        self.stacks.pop(command.old, None)
        self._times = _DecodeTimes()


class _DecodeTimes:
    """Sums decode-step compute per stack; hands out a report every REPORT_S."""

    def __init__(self):
        self.stack_id, self.steps, self.compute_s = 0, 0, 0.0
        self.since = time.monotonic()

    def add(self, stack_id: int, compute_s: float) -> tuple[int, int, float] | None:
        if stack_id != self.stack_id:
            self.stack_id, self.steps, self.compute_s = stack_id, 0, 0.0
        self.steps, self.compute_s = self.steps + 1, self.compute_s + compute_s
        if time.monotonic() - self.since < REPORT_S:
            return None
        report = (self.stack_id, self.steps, self.compute_s)
        self.steps, self.compute_s, self.since = 0, 0.0, time.monotonic()
        return report


def _serve(stacks: _Stacks, conn) -> None:
    """Runs the leader's commands in order until Stop."""
    parent = os.getppid()
    while True:
        if not conn.poll(HEARTBEAT_S):
            if os.getppid() != parent:
                raise ConnectionError("the leader process is gone")
            continue
        message = conn.recv()  # EOFError when the leader closed its end
        match message:
            case OpenCache():
                stacks.open(message)
            case FreeCache(session_id):
                stacks.caches.pop(session_id, None)
            case RunStep():
                stacks.step(message)
            case LoadStack():
                stacks.load_in_background(message)
            case DropStack(stack_id):
                stacks.stacks.pop(stack_id, None)
            case Resplit():
                stacks.resplit(message)
            case Stop():
                return
            case _:
                raise TypeError(f"unexpected command {message!r}")


def _heartbeats(conn, rank: int, lock: threading.Lock) -> None:
    stopped = threading.Event()
    while not stopped.wait(HEARTBEAT_S):
        with lock:
            if not _try_send(conn, Heartbeat(rank)):
                return


def _try_send(conn, message) -> bool:
    try:
        conn.send(message)
        return True
    except (OSError, ValueError):
        return False


def _die_with_parent() -> None:
    """Asks Linux to SIGKILL this rank when the leader dies, however it dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        logger.debug("prctl unavailable; relying on the pipe and parent checks")
