"""A peer served by a tensor-parallel group: the leader's side (rank 0).

The leader owns the network; its `PeerCore` runs sessions on `TPBlocks` (peer/tp/blocks.py),
which has the same interface as a one-process `BlockStack`. `TPGroup` holds the group together
from rank 0, each part in its own module beside this one:

- starting and stopping the other ranks' processes (peer/tp/launch.py), which run
  peer/tp/rank.py's loop;
- the commands and replies over each rank's pipe (peer/tp/messages.py), and what every rank
  does over `torch.distributed` (peer/tp/collectives.py);
- which slice of each layer a rank holds (peer/tp/shard.py);
- heartbeats and the leader's watch over its ranks (peer/tp/liveness.py), and failing the whole
  group at once (peer/tp/failure.py).

Degrees: with `degrees` (a peer whose plan chooses its degree) the group keeps one rank per
offered device, and each stack of blocks runs at its own degree k on ranks 0..k-1 over a
sub-group built at start (peer/tp/collectives.py); `load_stack(start, end, tp)` loads a stack at
another degree beside the serving one, so a plan that changes the degree moves the peer
make-before-break like a plan that changes its range.

Uneven splits (`--partition auto`, Hepti §4.3): right after joining, every rank profiles itself
and the group agrees on the LP's shares (peer/tp/profile.py) before anything loads. While
serving, each rank reports its compute per decode step; `decode_window` hands those
(peer/tp/windows.py) to the leader's drift check (peer/tp/partition.py), and `repartition` loads
a new split beside the serving one and switches between two steps, every open session's keys
and values re-split along the KV-head boundaries (`TPBlocks.switch_to`).

Failure: a rank that exits, stops sending heartbeats for `timeout_s`, or breaks a collective
(each one times out after `timeout_s`) fails the whole group at once: the leader kills the
other ranks and calls `on_failure`, after which every request is answered with PEER_FAILED and
the peer leaves (peer/runtime.py).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from hexswarm.peer.devices import describe, threads_per_rank
from hexswarm.peer.tp.blocks import TPBlocks
from hexswarm.peer.tp.collectives import join_group, load_shard, subgroups
from hexswarm.peer.tp.failure import GroupFailure, dead_rank
from hexswarm.peer.tp.launch import TPGroupError, spawn_rank, stop_processes, wait_until
from hexswarm.peer.tp.liveness import HEARTBEAT_S, Liveness
from hexswarm.peer.tp.messages import (
    DropStack,
    Failed,
    Heartbeat,
    Joining,
    Loaded,
    LoadStack,
    RankPipes,
    RankSetup,
    Ready,
    Slowdown,
    StepTimes,
    Stop,
)
from hexswarm.peer.tp.partition import Repartitioner, step_time_s
from hexswarm.peer.tp.profile import ComputeClock, first_partition, log_agreed
from hexswarm.peer.tp.shard import Partition
from hexswarm.peer.tp.windows import DecodeWindows
from hexswarm.swarm.models.model_spec import ModelSpec
from hexswarm.swarm.tools import log_setup
from hexswarm.swarm.tools.launcher import free_port
from hexswarm.swarm.trust.records import DeviceInfo
from hexswarm.swarm.wire.protocol import ErrorCode, ProtocolError

logger = logging.getLogger(__name__)

WATCH_S = 0.2  # how often the leader reads its ranks' messages and checks they live


class TPGroup:
    """Ranks 1..K-1 of this peer: their processes, pipes and liveness."""

    def __init__(
        self,
        spec: ModelSpec,
        start: int,
        end: int,
        dtype: torch.dtype,
        devices: tuple[torch.device, ...],
        timeout_s: float,
        on_failure: Callable[[str], None],
        degrees: tuple[int, ...] = (),
        quant: str = "none",
        partition: str = "even",
        slowdowns: dict[int, Slowdown] | None = None,
    ):
        self.spec, self.start, self.end, self.dtype = spec, start, end, dtype
        self.quant = quant  # every rank quantizes its shard the same way (peer/quant.py)
        self.partition_mode = partition  # "even" (1/tp each) or "auto" (Hepti's LP)
        self.slowdowns = slowdowns or {}  # benchmark-only: rank -> how much slower it computes
        self.repartitioner: Repartitioner | None = None  # the leader's drift check (auto only)
        self.split = None  # the LP's answer at start (routing.hepti.split.HeptiSplit; auto only)
        self.repartitions = 0
        self.observed_step_s = 0.0  # the group's mean decode step over the last window (auto only)
        self.clock = ComputeClock(self.slowdowns.get(0))  # rank 0's compute, apart from its waits
        self._windows = DecodeWindows()
        self.devices, self.tp, self.timeout_s = devices, len(devices), timeout_s  # tp: ranks in the group
        self.degrees = degrees  # other degrees its stacks may run at (sub-groups of ranks 0..k-1)
        self.on_failure = on_failure
        self._groups: dict[int, object] = {}  # degree -> its process group (None: the whole group)
        self.device_info: tuple[DeviceInfo, ...] = ()
        self._procs: dict[int, multiprocessing.Process] = {}
        self._pipes = RankPipes()
        self._joining: set[int] = set()
        self._ready: dict[int, Ready] = {}
        self._loaded: set[tuple[int, int]] = set()  # (rank, stack id) of finished LoadStacks
        self._stack_ids = 0  # the last stack id handed out (0: the stack the group started with)
        self._stopping = threading.Event()
        self._failure = GroupFailure(self._procs, on_failure, self._stopping)
        self._liveness = Liveness(self._procs, timeout_s)
        self._watcher: threading.Thread | None = None
        self._joined = False

    @property
    def failure(self) -> str | None:
        """Why the group failed (None while it serves)."""
        return self._failure.reason

    @property
    def rank_processes(self) -> dict[int, multiprocessing.Process]:
        """Ranks 1..K-1 by rank (for logs, and for tests that break one)."""
        return dict(self._procs)

    def launch(self) -> TPBlocks:
        """Spawns the ranks, joins the process group, loads rank 0's shard and waits until every
        rank has loaded its own (blocking: run it in a thread). Raises TPGroupError on failure."""
        threads = threads_per_rank(self.devices)
        if threads is not None:
            torch.set_num_threads(threads)
        init_method = f"tcp://127.0.0.1:{free_port()}"
        self._spawn(init_method, threads)
        try:
            # Spawning and importing take seconds on a busy machine: only once every rank is
            # up does the rendezvous start, so its `timeout_s` bounds the join alone.
            self._wait_for(lambda: len(self._joining) == self.tp - 1, "start")
            join_group(self._setup(0, init_method, threads))
            self._joined = True
            self._groups = subgroups(self.tp, self.degrees)
            self._agree_partition(self._setup(0, init_method, threads))
            local = self._load_local(self.start, self.end, self.tp, self.partition)
            self._wait_for(lambda: len(self._ready) == self.tp - 1, "load their shards")
        except Exception as e:
            self.fail(f"the group failed to start: {type(e).__name__}: {e}")
            raise TPGroupError(self.failure) from e
        self.device_info = (describe(self.devices[0], threads),) + tuple(
            self._ready[r].device for r in range(1, self.tp)
        )
        logger.info("tensor-parallel group of %d ready on %s", self.tp, ",".join(map(str, self.devices)))
        return TPBlocks(self, local, 0, self.tp)

    def _spawn(self, init_method: str, threads: int | None) -> None:
        context = multiprocessing.get_context("spawn")  # a fork would copy the DHT's threads
        for rank in range(1, self.tp):
            proc, conn = spawn_rank(context, self._setup(rank, init_method, threads))
            self._procs[rank] = proc
            self._pipes.add(rank, conn)
            logger.info("tensor-parallel rank %d: pid %d on %s", rank, proc.pid, self.devices[rank])
        self._watcher = threading.Thread(target=self._watch, name="tp-watch", daemon=True)
        self._watcher.start()

    def _agree_partition(self, setup: RankSetup) -> None:
        agreed = first_partition(setup, self.devices[0], self.spec, self.clock)
        if agreed is None:
            return
        self.split = agreed.split
        self.repartitioner = Repartitioner(agreed.problem, agreed.partition)
        log_agreed(agreed)

    def _load_local(self, start: int, end: int, tp: int, partition: Partition | None):
        """Rank 0's shard of blocks [start, end) at degree `tp` (a BlockStack)."""
        return load_shard(
            self.spec,
            start,
            end,
            self.dtype,
            self.devices[0],
            0,
            tp,
            self.process_group(tp),
            self.quant,
            partition,
            self.clock,
        )

    def load_stack(
        self, start: int, end: int, tp: int | None = None, partition: Partition | None = None
    ) -> TPBlocks:
        """Loads blocks [start, end) at degree `tp` (default: every rank) beside the stacks serving
        now, which keep serving meanwhile (a move: peer/range_move.py, or a re-partition). At the
        full degree the stack takes `partition`, by default the group's. Blocking: run it in a
        thread. Raises TPGroupError if the group fails, a rank's load included."""
        tp = tp or self.tp
        if tp not in self._groups and tp != 1:
            raise ValueError(f"degree {tp} is not one this group was started for ({sorted(self._groups)})")
        partition = (partition or self.partition) if tp == self.tp else None
        self._stack_ids += 1
        stack_id, ranks = self._stack_ids, range(1, tp)
        self.send_to(ranks, LoadStack(stack_id, start, end, tp, partition))
        local = self._load_local(start, end, tp, partition)
        self._wait_for(lambda: all((r, stack_id) in self._loaded for r in ranks), "load a range")
        logger.info("tensor-parallel group loaded [%d:%d) at degree %d as stack %d", start, end, tp, stack_id)
        return TPBlocks(self, local, stack_id, tp)

    def repartition(self, blocks: TPBlocks, partition: Partition) -> None:
        """Serves `partition` from now on: loads it beside `blocks`' stack, then switches
        between two steps with every open session's cache re-split (make-before-break).
        Blocking: run it in a thread."""
        began = time.monotonic()
        new = self.load_stack(blocks.start, blocks.end, self.tp, partition)
        blocks.switch_to(new)
        self.repartitions += 1
        self._windows.clear()  # figures of the old split
        self.repartitioner.adopt(partition)
        self.split = self.repartitioner.last_split or self.split
        logger.info(
            "re-partitioned in %.1f s: KV heads %s, MLP columns %s per rank",
            time.monotonic() - began,
            partition.kv_groups,
            partition.mlp_columns,
        )

    @property
    def partition(self) -> Partition | None:
        """The uneven split the full degree serves at (None: 1/tp each)."""
        return self.repartitioner.partition if self.repartitioner is not None else None

    def predicted_step_s(self) -> float:
        """The LP's step time for the split served now, at the speeds last observed (Eq. 7)."""
        return step_time_s(self.repartitioner.problem, self.partition)

    def note_decode(self, rank: int, stack_id: int, steps: int, compute_s: float) -> None:
        """Adds a rank's decode compute to the current window (see `decode_window`)."""
        self._windows.note(rank, stack_id, steps, compute_s)

    def decode_window(self, stack_id: int, min_steps: int) -> tuple[list[float], int]:
        """Each rank's mean compute per decode step of stack `stack_id` over the current window,
        and the fewest steps any rank reported. A window ends (and the next starts) once every
        rank has reported `min_steps`; before that this returns ([], fewest)."""
        return self._windows.take(stack_id, self.tp, min_steps)

    def process_group(self, tp: int):
        """The process group a stack of degree `tp` runs its collectives over (None: all ranks)."""
        return self._groups.get(tp)

    def drop_stack(self, blocks: TPBlocks) -> None:
        """Frees a stack on its ranks once no session runs on it (after a move's drain)."""
        self.send_to(blocks.ranks, DropStack(blocks.stack_id), quiet=True)

    def _setup(self, rank: int, init_method: str, threads: int | None) -> RankSetup:
        return RankSetup(
            rank=rank,
            tp=self.tp,
            device=str(self.devices[rank]),
            model_dir=str(self.spec.path),
            start=self.start,
            end=self.end,
            dtype=self.dtype,
            init_method=init_method,
            timeout_s=self.timeout_s,
            threads=threads,
            degrees=self.degrees,
            quant=self.quant,
            partition=self.partition_mode,
            slowdown=self.slowdowns.get(rank),
            log_format=f"%(asctime)s %(levelname)s {log_setup.context()} tp rank {rank}: %(message)s",
            log_level=logging.getLogger().getEffectiveLevel(),
        )

    def _wait_for(self, done: Callable[[], bool], what: str) -> None:
        wait_until(done, what, lambda: self.failure)

    def _watch(self) -> None:
        """Reads the ranks' messages and checks they live, until the group stops."""
        while not self._stopping.wait(WATCH_S):
            for rank in self._pipes.conns:
                self._pipes.drain(rank, self._receive)
                reason = self._liveness.failure(rank, rank in self._ready)
                if reason is not None:
                    self.fail(reason)

    def _receive(self, rank: int, message: object) -> None:
        self._liveness.heard(rank)
        match message:
            case Joining():
                self._joining.add(rank)
            case Ready():
                self._ready[rank] = message
            case Loaded(stack_id=stack_id):
                self._loaded.add((rank, stack_id))
            case StepTimes(stack_id=stack_id, steps=steps, compute_s=compute_s):
                self.note_decode(rank, stack_id, steps, compute_s)
            case Failed(reason=reason):
                self.fail(f"tensor-parallel rank {rank} failed: {reason}")
            case Heartbeat():
                pass

    def dead_rank(self, wait_s: float = 1.0) -> str | None:
        """Which rank died, if one did (a broken collective is usually why); None otherwise."""
        return dead_rank(self._procs, wait_s)

    def send_all(self, message, *, quiet: bool = False) -> None:
        """Sends a command to every rank; with `quiet`, a failed group is not an error."""
        self.send_to(self._pipes.conns, message, quiet=quiet)

    def send_to(self, ranks: Iterable[int], message, *, quiet: bool = False) -> None:
        """Sends a command to `ranks` (1..K-1), in the order of every other command."""
        if self.failure is not None:
            if quiet:
                return
            raise ProtocolError(ErrorCode.PEER_FAILED, self.failure)
        try:
            self._pipes.send(ranks, message)
        except (OSError, ValueError) as e:
            self.fail(self.dead_rank() or f"cannot reach a tensor-parallel rank: {type(e).__name__}: {e}")
            if not quiet:
                raise ProtocolError(ErrorCode.PEER_FAILED, self.failure) from None

    def fail(self, reason: str) -> None:
        """Fails the group once: kills every rank and tells the peer (peer/tp/failure.py)."""
        self._failure.fail(reason)

    def stop(self) -> None:
        """Stops every rank: politely if the group is healthy, by SIGKILL after STOP_TIMEOUT_S."""
        if self.failure is None:
            self.send_all(Stop(), quiet=True)
        self._stopping.set()
        stop_processes(self._procs.values())
        # A failed gloo group is torn down too: this process may start another group (a test, a
        # retry). A failed NCCL one is left to the process's exit, as its teardown may wait on
        # the dead rank.
        if self._joined and (self.failure is None or dist.get_backend() == "gloo"):
            dist.destroy_process_group()
        self._joined = False


__all__ = ["HEARTBEAT_S", "TPBlocks", "TPGroup", "TPGroupError"]
