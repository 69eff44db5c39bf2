"""A tensor-parallel rank other than the leader: its process and its loop.

Ranks 1..K-1 of a peer are child processes of the leader (rank 0), spawned by
peer/tp/launch.py. Each joins the group's process group (peer/tp/collectives.py), loads its
shard, and then runs the leader's commands from its pipe in order (peer/tp/messages.py) until
`Stop`: a step's hidden states arrive by broadcast from rank 0, and every layer all-reduces its
row-parallel outputs. Commands go through the pipe rather than a collective so that an idle
group waits in `poll`, not in a collective that would time out.

A peer whose plan chooses its degree (`--layers auto --tp auto`) starts one rank per offered
device and serves at degree k on ranks 0..k-1: every rank builds the same sub-groups at start,
each stack of blocks runs on the sub-group of its degree, and a rank outside a stack's degree
gets none of its commands. So a change of degree is a move like any other: the new stack loads
beside the old one on the ranks it needs.

Liveness, both ways (peer/tp/liveness.py): a rank sends a heartbeat every HEARTBEAT_S (the
leader declares it hung after `timeout_s` of silence), and exits when the leader's end of the
pipe closes or the leader process dies (PR_SET_PDEATHSIG on Linux, and a parent-pid check as a
fallback).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hexswarm.peer.tp.collectives import (
    all_reduce_over,
    broadcast_from_leader,
    join_group,
    load_shard,
    subgroups,
)
from hexswarm.peer.tp.liveness import HEARTBEAT_S, die_with_parent, send_heartbeats
from hexswarm.peer.tp.messages import (
    DropStack,
    Failed,
    FreeCache,
    Joining,
    Loaded,
    LoadStack,
    OpenCache,
    RankSetup,
    Ready,
    Resplit,
    RunStep,
    StepTimes,
    Stop,
    try_send,
)
from hexswarm.peer.tp.profile import ComputeClock, first_partition
from hexswarm.peer.tp.shard import resplit_sessions
from hexswarm.peer.tp.windows import DecodeTimes
from hexswarm.swarm.tools import log_setup

logger = logging.getLogger(__name__)


def rank_main(setup: RankSetup, conn) -> None:
    """Entry point of rank processes 1..K-1 (spawned by peer/tp/launch.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the leader, which stops the group
    die_with_parent()
    logging.basicConfig(level=setup.log_level, format=setup.log_format, stream=sys.stderr, force=True)
    log_setup.disable_progress()  # the leader draws the group's progress bars
    if setup.threads is not None:
        torch.set_num_threads(setup.threads)
    from hexswarm.peer.devices import describe  # heavy imports after the process is set up
    from hexswarm.swarm.models.model_spec import load_model_spec

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
    threading.Thread(target=send_heartbeats, args=(conn, setup.rank, send_lock), daemon=True).start()

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
            try_send(conn, Failed(setup.rank, f"{type(e).__name__}: {e}"))
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
        self._times = DecodeTimes()

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
            try_send(self._conn, reply)

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
                    try_send(self._conn, StepTimes(self._rank, *report))

    def resplit(self, command: Resplit) -> None:
        """Moves the sessions' caches to the new stack's split (with every other rank), then
        drops the old stack."""
        old, new = self.stacks[command.old], self.stacks[command.new]
        all_reduce = all_reduce_over(new.group)
        self.caches.update(
            resplit_sessions(old.blocks, new.blocks, command.sessions, self.caches, self._rank, all_reduce)
        )
        self.stacks.pop(command.old, None)
        self._times = DecodeTimes()


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
