"""A peer served by a tensor-parallel group: the leader's side (rank 0).

The leader owns the network; its `PeerCore` runs sessions on `TPBlocks`, which has the same
interface as a one-process `BlockStack`. Each step is sent to every rank of its stack (a `RunStep` over
its pipe), the hidden states are broadcast from rank 0, every rank runs its shard of the
layers (all-reducing after each row-parallel module, peer/tp_shard.py) and the leader returns
its copy of the result. Opening and freeing a session's cache reach every rank the same way,
so no rank keeps a cache its leader has freed (close, disconnect, idle expiry).

Degrees: with `degrees` (a peer whose plan chooses its degree) the group keeps one rank per
offered device, and each stack of blocks runs at its own degree k on ranks 0..k-1 over a
sub-group built at start (peer/tp_rank.py); `load_stack(start, end, tp)` loads a stack at
another degree beside the serving one, so a plan that changes the degree moves the peer
make-before-break like a plan that changes its range.

Uneven splits (`--partition auto`, Hepti §4.3): right after joining, every rank profiles itself
and the group agrees on the LP's shares (peer/tp_profile.py) before anything loads. While
serving, each rank reports its compute per decode step; `decode_window` hands those to the
leader's drift check (peer/tp_partition.py), and `repartition` loads a new split beside the
serving one and switches between two steps, every open session's keys and values re-split
along the KV-head boundaries (`TPBlocks.switch_to`).

Failure: a rank that exits, stops sending heartbeats for `timeout_s`, or breaks a collective
(each one times out after `timeout_s`) fails the whole group at once: the leader kills the
other ranks (which also unblocks any collective it is waiting in) and calls `on_failure`,
after which every request is answered with PEER_FAILED and the peer leaves (peer/runtime.py).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from transformers import DynamicCache

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.devices import describe, threads_per_rank
from hexswarm.peer.tp_partition import Repartitioner, step_time_s
from hexswarm.peer.tp_profile import ComputeClock, Slowdown
from hexswarm.peer.tp_rank import (
    HEARTBEAT_S,
    DropStack,
    Failed,
    FreeCache,
    Heartbeat,
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
    all_reduce_over,
    broadcast_from_leader,
    first_partition,
    join_group,
    load_shard,
    rank_main,
    subgroups,
)
from hexswarm.peer.tp_shard import Partition, resplit_sessions
from hexswarm.swarm import log_setup
from hexswarm.swarm.launcher import free_port
from hexswarm.swarm.model_spec import ModelSpec
from hexswarm.swarm.protocol import ErrorCode, ProtocolError
from hexswarm.swarm.records import DeviceInfo

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0  # loading a large shard from disk may take minutes
STOP_TIMEOUT_S = 10.0


class TPGroupError(RuntimeError):
    """The group could not start."""


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
        self._windows: dict[tuple[int, int], list] = {}  # (rank, stack id) -> [decode steps, compute s]
        self.devices, self.tp, self.timeout_s = devices, len(devices), timeout_s  # tp: ranks in the group
        self.degrees = degrees  # other degrees its stacks may run at (sub-groups of ranks 0..k-1)
        self.on_failure = on_failure
        self._groups: dict[int, object] = {}  # degree -> its process group (None: the whole group)
        self.failure: str | None = None
        self.device_info: tuple[DeviceInfo, ...] = ()
        self._procs: dict[int, multiprocessing.Process] = {}
        self._conns: dict[int, object] = {}
        self._joining: set[int] = set()
        self._ready: dict[int, Ready] = {}
        self._loaded: set[tuple[int, int]] = set()  # (rank, stack id) of finished LoadStacks
        self._stack_ids = 0  # the last stack id handed out (0: the stack the group started with)
        self._last_seen: dict[int, float] = {}
        self._send_lock = threading.Lock()
        self._fail_lock = threading.Lock()
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self._joined = False

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
        context = multiprocessing.get_context("spawn")  # a fork would copy the DHT's threads
        for rank in range(1, self.tp):
            parent_end, child_end = context.Pipe()
            setup = self._setup(rank, init_method, threads)
            proc = context.Process(
                target=rank_main, args=(setup, child_end), name=f"tp-rank-{rank}", daemon=True
            )
            proc.start()
            child_end.close()
            self._procs[rank], self._conns[rank] = proc, parent_end
            logger.info("tensor-parallel rank %d: pid %d on %s", rank, proc.pid, self.devices[rank])
        self._watcher = threading.Thread(target=self._watch, name="tp-watch", daemon=True)
        self._watcher.start()
        try:
            # Spawning and importing take seconds on a busy machine: only once every rank is
            # up does the rendezvous start, so its `timeout_s` bounds the join alone.
            self._wait_for(lambda: len(self._joining) == self.tp - 1, "start")
            join_group(self._setup(0, init_method, threads))
            self._joined = True
            self._groups = subgroups(self.tp, self.degrees)
            self._agree_partition(init_method, threads)
            local = load_shard(
                self.spec,
                self.start,
                self.end,
                self.dtype,
                self.devices[0],
                0,
                self.tp,
                None,
                self.quant,
                self.partition,
                self.clock,
            )
            self._wait_for(lambda: len(self._ready) == self.tp - 1, "load their shards")
        except Exception as e:
            self.fail(f"the group failed to start: {type(e).__name__}: {e}")
            raise TPGroupError(self.failure) from e
        self.device_info = (describe(self.devices[0], threads),) + tuple(
            self._ready[r].device for r in range(1, self.tp)
        )
        logger.info("tensor-parallel group of %d ready on %s", self.tp, ",".join(map(str, self.devices)))
        return TPBlocks(self, local, 0, self.tp)

    def _agree_partition(self, init_method: str, threads: int | None) -> None:
        agreed = first_partition(self._setup(0, init_method, threads), self.devices[0], self.spec, self.clock)
        if agreed is None:
            return
        self.split = agreed.split
        self.repartitioner = Repartitioner(agreed.problem, agreed.partition)
        devices = agreed.problem.devices
        logger.info(
            "profiled ranks: %s GFLOP/s, %s GiB free, all-reduce %.0f us a layer",
            [round(d.flops / 1e9, 2) for d in devices],
            [round(d.free_bytes / 2**30, 1) for d in devices],
            sum(agreed.problem.comm_s(i) for i in range(1, len(devices)))
            / agreed.problem.shape.num_layers
            * 1e6,
        )
        logger.info(
            "Hepti split (%s): KV heads %s, MLP columns %s per rank; predicted %.1f ms a step (even: %s)",
            agreed.split.mode,
            agreed.partition.kv_groups,
            agreed.partition.mlp_columns,
            agreed.split.step_time_s * 1000,
            f"{agreed.split.even_step_time_s * 1000:.1f} ms"
            if agreed.split.even_step_time_s != float("inf")
            else "none that fits",
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
        local = load_shard(
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
        window = self._windows.setdefault((rank, stack_id), [0, 0.0])
        window[0] += steps
        window[1] += compute_s

    def decode_window(self, stack_id: int, min_steps: int) -> tuple[list[float], int]:
        """Each rank's mean compute per decode step of stack `stack_id` over the current window,
        and the fewest steps any rank reported. A window ends (and the next starts) once every
        rank has reported `min_steps`; before that this returns ([], fewest)."""
        windows = [self._windows.get((rank, stack_id), [0, 0.0]) for rank in range(self.tp)]
        steps = min(w[0] for w in windows)
        if steps < min_steps:
            return [], steps
        for rank in range(self.tp):
            self._windows.pop((rank, stack_id), None)
        return [w[1] / w[0] for w in windows], steps

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
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not done():
            if self.failure is not None:
                raise TPGroupError(self.failure)
            if time.monotonic() > deadline:
                raise TPGroupError(f"the ranks did not {what} within {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def _watch(self) -> None:
        """Reads the ranks' messages and checks they live, until the group stops."""
        while not self._stopping.wait(0.2):
            for rank, conn in self._conns.items():
                self._drain(rank, conn)
                silent = time.monotonic() - self._last_seen.get(rank, time.monotonic())
                if self._procs[rank].exitcode is not None:
                    self.fail(self.dead_rank(0))
                elif rank in self._ready and silent > self.timeout_s:
                    self.fail(f"tensor-parallel rank {rank} sent no heartbeat for {silent:.0f} s (hung?)")

    def _drain(self, rank: int, conn) -> None:
        try:
            while conn.poll():
                message = conn.recv()
                self._last_seen[rank] = time.monotonic()
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
        except (EOFError, OSError):
            pass  # the process is gone; its exit code tells the rest

    def dead_rank(self, wait_s: float = 1.0) -> str | None:
        """Which rank died, if one did (a broken collective is usually why); None otherwise."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, proc in self._procs.items():
                if proc.exitcode is not None:
                    return f"tensor-parallel rank {rank} (pid {proc.pid}) {_exit_reason(proc.exitcode)}"
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def send_all(self, message, *, quiet: bool = False) -> None:
        """Sends a command to every rank; with `quiet`, a failed group is not an error."""
        self.send_to(self._conns, message, quiet=quiet)

    def send_to(self, ranks, message, *, quiet: bool = False) -> None:
        """Sends a command to `ranks` (1..K-1), in the order of every other command."""
        if self.failure is not None:
            if quiet:
                return
            raise ProtocolError(ErrorCode.PEER_FAILED, self.failure)
        try:
            with self._send_lock:
                for rank in ranks:
                    self._conns[rank].send(message)
        except (OSError, ValueError) as e:
            self.fail(self.dead_rank() or f"cannot reach a tensor-parallel rank: {type(e).__name__}: {e}")
            if not quiet:
                raise ProtocolError(ErrorCode.PEER_FAILED, self.failure) from None

    def fail(self, reason: str) -> None:
        """Fails the group once: kills every rank and tells the peer."""
        with self._fail_lock:
            if self.failure is not None or self._stopping.is_set():
                return
            self.failure = reason
        logger.error("%s; stopping the group", reason)
        for proc in self._procs.values():
            if proc.exitcode is None:
                proc.kill()
        self.on_failure(reason)

    def stop(self) -> None:
        """Stops every rank: politely if the group is healthy, by SIGKILL after STOP_TIMEOUT_S."""
        if self.failure is None:
            self.send_all(Stop(), quiet=True)
        self._stopping.set()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self._procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                logger.warning("rank %s did not stop; killing it", proc.name)
                proc.kill()
                proc.join(5)
        if self._joined and self.failure is None:
            dist.destroy_process_group()
        self._joined = False


@dataclass
class GroupCache:
    """Rank 0's share of a session's KV cache; the other ranks keep theirs under the same id."""

    session_id: str
    local: DynamicCache


class TPBlocks:
    """A stack of the group's blocks as PeerCore sees it: one BlockStack's interface, run on
    ranks 0..tp-1 (at degree 1, on the leader alone)."""

    def __init__(self, group: TPGroup, local: BlockStack, stack_id: int, tp: int):
        self.group, self.local, self.stack_id, self.tp = group, local, stack_id, tp
        self.spec, self.start, self.end = local.spec, local.start, local.end
        self.dtype, self.device, self.config = local.dtype, local.device, local.config
        self.ranks = range(1, tp)  # the other ranks that hold a shard of this stack
        self.process_group = group.process_group(tp)
        self.caches: dict[str, GroupCache] = {}  # open sessions (their caches move in a re-partition)
        self.decode_step_s = [0, 0.0]  # [decode steps, seconds] of the group since the last reading
        self._lock = threading.Lock()  # a switch of split happens between two steps ...
        self._switching = threading.Lock()  # ... and not while a session's cache opens or closes

    def new_cache(self, session_id: str) -> GroupCache:
        with self._switching:  # not while a switch moves the caches (it lists them first)
            self.group.send_to(self.ranks, OpenCache(session_id, self.stack_id))
            cache = GroupCache(session_id, self.local.new_cache(session_id))
            self.caches[session_id] = cache
            return cache

    def release(self, session_id: str) -> None:
        with self._switching:
            self.caches.pop(session_id, None)
            self.group.send_to(self.ranks, FreeCache(session_id), quiet=True)

    def read_decode_step_s(self) -> tuple[float, int]:
        """The group's mean decode step (s) since the last reading, and how many steps."""
        steps, seconds = self.decode_step_s
        self.decode_step_s = [0, 0.0]
        return (seconds / steps if steps else float("nan")), steps

    def switch_to(self, new: TPBlocks) -> None:
        """Serves `new`'s stack (same blocks, another split) from the next step on: between two
        steps, every rank re-splits each open session's keys and values (peer/tp_shard.py
        `resplit_sessions`) and drops this stack."""
        with self._switching, self._lock:
            sessions = tuple((sid, _filled_layers(cache.local)) for sid, cache in self.caches.items())
            self.group.send_to(self.ranks, Resplit(self.stack_id, new.stack_id, sessions))
            local_caches = {sid: cache.local for sid, cache in self.caches.items()}
            all_reduce = all_reduce_over(new.process_group)
            for session_id, moved in resplit_sessions(
                self.local, new.local, sessions, local_caches, 0, all_reduce
            ).items():
                self.caches[session_id].local = moved
            self.local, self.stack_id = new.local, new.stack_id
            self.config = new.local.config

    def __call__(
        self, hidden: torch.Tensor, cache: GroupCache, position: int, start: int, end: int
    ) -> torch.Tensor:
        if self.group.failure is not None:  # (a stack of degree 1 sends nothing that would tell)
            raise ProtocolError(ErrorCode.PEER_FAILED, self.group.failure)
        if self.tp == 1:
            return self.local(hidden, cache.local, position, start, end)
        with self._lock:
            return self._step(hidden, cache, position, start, end)

    def _step(
        self, hidden: torch.Tensor, cache: GroupCache, position: int, start: int, end: int
    ) -> torch.Tensor:
        began = time.perf_counter()
        batch, tokens, width = hidden.shape
        step = RunStep(cache.session_id, position, start, end, (batch, tokens, width), self.stack_id)
        self.group.send_to(self.ranks, step)
        try:
            hidden = hidden.contiguous()
            broadcast_from_leader(hidden, self.process_group)
            self.group.clock.begin_step()
            output = self.local(hidden, cache.local, position, start, end)
            observed = self.group.repartitioner is not None  # only a drift check reads them
            if observed and (batch, tokens) == (1, 1):  # decode steps are what the split is sized for
                self.group.note_decode(0, self.stack_id, 1, self.group.clock.end_step())
                self.decode_step_s[0] += 1
                self.decode_step_s[1] += time.perf_counter() - began
            return output
        except (RuntimeError, OSError) as e:  # torch.distributed raises RuntimeError subclasses
            self.group.fail(self.group.dead_rank() or f"a collective failed: {type(e).__name__}: {e}")
            raise ProtocolError(ErrorCode.PEER_FAILED, self.group.failure or str(e)) from None


def _filled_layers(cache: DynamicCache) -> tuple[tuple[int, int, int], ...]:
    """(local layer, batch, length) of each layer of `cache` that holds keys and values."""
    return tuple(
        (index, layer.keys.shape[0], layer.keys.shape[2])
        for index, layer in enumerate(cache.layers)
        if getattr(layer, "is_initialized", False) and layer.keys.numel()
    )


def _exit_reason(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


__all__ = ["HEARTBEAT_S", "TPBlocks", "TPGroup", "TPGroupError"]
