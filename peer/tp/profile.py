"""What each rank of a `--partition auto` group measures, and how the group agrees on its split.

Hepti §4.3 profiles every device before it partitions: its compute speed f_i, its free memory
s_i and its link to the leader (BW_i and a latency). Here every rank measures its own at start,
its speed in turn (ranks that share a machine's cores would otherwise measure the scheduler):

- speed: FLOP/s of matrix-vector products of the layer's MLP shape over more weights than the
  caches hold, in the peer's dtype: what a decode step does;
- free memory: the GPU's free bytes, or on a CPU the available RAM shared among the group's
  CPU ranks;
- the link: ping-pongs of a small and a 1 MiB tensor with rank 0 over the group's own backend,
  scaled so that their sum is what an all-reduce of the group measures (see `calibrate_links`).

The figures are all-gathered, rank 0 solves Hepti's LP (peer/tp/partition.py) and broadcasts
the shares, so every rank loads the same split: every rank, the leader included, calls
`first_partition` right after joining its group, and the leader logs what was measured and
agreed (`log_agreed`).

`ComputeClock` splits each of a rank's steps into its own compute and its waits in collectives
(the observed speeds a re-partition starts from), and applies the benchmark-only slowdown
(`run-peer --debug-slowdown RANK:FACTOR[@SECONDS]`): after each stretch of compute the rank
sleeps (FACTOR - 1) times as long, so it computes FACTOR times slower without taking a core;
from the start (profiling included), or from SECONDS after the rank's first step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import psutil
import torch
import torch.distributed as dist

from hexswarm.peer.tp.messages import Slowdown
from hexswarm.peer.tp.partition import RankProfile, calibrate_links, hepti_problem, layer_shape, partition_of
from hexswarm.peer.tp.shard import Partition
from hexswarm.routing.hepti.problem import HeptiProblem
from hexswarm.routing.hepti.split import HeptiInfeasibleError, HeptiSplit, plan_split
from hexswarm.routing.scheduler.weight_formats import bytes_per_weight

if TYPE_CHECKING:
    from hexswarm.peer.tp.messages import RankSetup

logger = logging.getLogger(__name__)

PROFILE_WEIGHT_BYTES = 64 << 20  # more than a CPU's caches: decode streams its weights from memory
PROFILE_SECONDS = 0.3
ARRIVAL_TIMEOUT_S = 120.0  # how long ranks wait for one still loading or measuring (arrival_barrier)
PING_ROUNDS = 20
BANDWIDTH_BYTES = 1 << 20


def parse_slowdown(text: str) -> tuple[int, Slowdown]:
    """'2:2.0@30' -> (rank 2, 2x slower after 30 s); ValueError names the expected form."""
    try:
        rank, rest = text.split(":", 1)
        factor, _, after = rest.partition("@")
        parsed = int(rank), Slowdown(float(factor), float(after or 0.0))
    except ValueError:
        raise ValueError(f"--debug-slowdown takes RANK:FACTOR[@SECONDS], got {text!r}") from None
    if parsed[0] < 0 or not parsed[1].factor >= 1.0 or not parsed[1].after_s >= 0:
        raise ValueError(f"--debug-slowdown needs a rank >= 0, a factor >= 1 and seconds >= 0: {text!r}")
    return parsed


class ComputeClock:
    """One rank's compute and collective time per step (and its slowdown, if any)."""

    def __init__(self, slowdown: Slowdown | None = None):
        self.slowdown = slowdown
        self._first_step: float | None = None  # a slowdown's `after_s` counts from here
        self._mark = time.perf_counter()
        self._compute = 0.0
        self._debt = 0.0

    def begin_step(self) -> None:
        self._compute, self._mark = 0.0, time.perf_counter()
        if self._first_step is None:
            self._first_step = time.monotonic()

    def end_step(self) -> float:
        """Seconds this step computed (waits in collectives excluded; slowdown included)."""
        self._lap()
        return self._compute

    def wrap(self, collective: Callable[[torch.Tensor], None]) -> Callable[[torch.Tensor], None]:
        """`collective`, timed apart from the compute before it."""

        def timed(tensor: torch.Tensor) -> None:
            self._lap()
            collective(tensor)
            self._mark = time.perf_counter()

        return timed

    def slow(self, seconds: float) -> float:
        """Sleeps off the slowdown owed for `seconds` of compute (no-op without a slowdown);
        returns the seconds slept."""
        if self.slowdown is None or not self._slowed():
            return 0.0
        self._debt += (self.slowdown.factor - 1.0) * seconds
        if self._debt <= 0:
            return 0.0
        began = time.perf_counter()
        time.sleep(self._debt)
        slept = time.perf_counter() - began
        self._debt -= slept  # sleeps overshoot: carry the difference
        return slept

    def _slowed(self) -> bool:
        """From the start with `after_s` 0 (profiling included), else `after_s` after the first step."""
        if not self.slowdown.after_s:
            return True
        return self._first_step is not None and time.monotonic() - self._first_step >= self.slowdown.after_s

    def _lap(self) -> None:
        now = time.perf_counter()
        self.slow(now - self._mark)
        self._compute += time.perf_counter() - self._mark
        self._mark = time.perf_counter()


def measure_flops(
    device: torch.device, dtype: torch.dtype, hidden: int, width: int, clock: ComputeClock
) -> float:
    """FLOP/s of decode-shaped products (one token through (hidden x width) weights) on `device`.

    On a CPU a round is timed by the CPU time of the thread that runs it (plus the benchmark
    slowdown's sleep), not by the wall clock: another process's burst on the machine's cores
    (a test worker starting peers beside the group, measured) could take a rank's core for all
    of its short turn and make a fast rank look as slow as a slowed one. A rank's share of a
    busy machine that persists shows in its observed steps, which re-partitions follow."""
    now = time.thread_time if device.type == "cpu" else time.perf_counter
    element = torch.tensor([], dtype=dtype).element_size()
    copies = max(1, PROFILE_WEIGHT_BYTES // (hidden * width * element))
    weights = [torch.randn(width, hidden, dtype=dtype, device=device) for _ in range(copies)]
    x = torch.randn(1, hidden, dtype=dtype, device=device)
    with torch.inference_mode():
        for w in weights:  # a first pass, untimed: kernel selection and first touches
            torch.nn.functional.linear(x, w)
        _sync(device)
        rounds, began, best = 0, time.perf_counter(), float("inf")
        while rounds < 3 or time.perf_counter() - began < PROFILE_SECONDS:
            lap = now()
            for w in weights:
                torch.nn.functional.linear(x, w)
            _sync(device)
            computed = now() - lap
            best = min(best, computed + clock.slow(computed))
            rounds += 1
    # The fastest round: another process's burst on shared cores slows some rounds, not the rank.
    return 2.0 * hidden * width * copies / best


def measure_flops_in_turn(
    rank: int, tp: int, device: torch.device, dtype: torch.dtype, hidden: int, width: int, clock: ComputeClock
) -> float:
    """`measure_flops`, one rank at a time (collective): ranks that share a machine's cores
    would otherwise measure how the scheduler shared them out, not how fast each one is."""
    flops = 0.0
    arrival_barrier()  # every rank is done loading before the first one measures
    for turn in range(tp):
        if turn == rank:
            flops = measure_flops(device, dtype, hidden, width, clock)
        arrival_barrier()  # the others wait out its turn (a slowed rank's is several times longer)
    return flops


def arrival_barrier(timeout_s: float = ARRIVAL_TIMEOUT_S) -> None:
    """A barrier that waits up to `timeout_s` for the slowest rank, not the group's collective
    timeout: that one is sized for a step, while a rank still loading its shard or measuring in
    its turn on a busy machine takes seconds longer (a 5 s test group's barrier timed out so).
    gloo (CPU) has a barrier with its own timeout; NCCL's runs under the group's."""
    if dist.get_backend() == "gloo":
        dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
    else:
        dist.barrier()


def free_bytes(device: torch.device, tp: int) -> float:
    """Memory free for this rank's weights (a CPU's available RAM shared by the group's ranks)."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    return psutil.virtual_memory().available / tp


def measure_link(rank: int, tp: int, device: torch.device) -> tuple[float, float]:
    """(one-way latency s, bandwidth B/s) between rank 0 and each other rank, in turn; every rank
    calls it (rank 0 returns zeros and infinity: it holds the step already)."""
    small, large = torch.zeros(1, device=device), torch.zeros(BANDWIDTH_BYTES // 4, device=device)
    figures = (0.0, float("inf"))
    for other in range(1, tp):
        if rank not in (0, other):
            continue
        peer = other if rank == 0 else 0
        latency = _ping(small, rank, peer, PING_ROUNDS, device) / 2
        transfer = _ping(large, rank, peer, 3, device) / 2
        if rank != 0:
            figures = (latency, BANDWIDTH_BYTES / max(transfer - latency, 1e-7))
    return figures


def _ping(tensor: torch.Tensor, rank: int, peer: int, rounds: int, device: torch.device) -> float:
    """Mean round trip of `tensor` between this rank and `peer` (rank 0 sends first)."""
    began = time.perf_counter()
    for _ in range(rounds):
        if rank == 0:
            dist.send(tensor, peer)
            dist.recv(tensor, peer)
        else:
            dist.recv(tensor, peer)
            dist.send(tensor, peer)
    _sync(device)
    return (time.perf_counter() - began) / rounds


def measure_all_reduce(hidden: int, width: int, dtype: torch.dtype, device: torch.device) -> float:
    """Median seconds of one all-reduce of a token's hidden state over the whole group, each
    after a decode-sized product as in a step (collective). Ranks fresh from their own compute
    wake slower in a collective than idle ones do, and a step is made of exactly that."""
    tensor = torch.zeros(1, hidden, dtype=dtype, device=device)
    weight = torch.randn(width, hidden, dtype=dtype, device=device)
    x = torch.randn(1, hidden, dtype=dtype, device=device)
    times = []
    with torch.inference_mode():
        for _ in range(2 * PING_ROUNDS):
            torch.nn.functional.linear(x, weight)
            _sync(device)
            began = time.perf_counter()
            dist.all_reduce(tensor)
            _sync(device)
            times.append(time.perf_counter() - began)
    times.sort()
    return times[len(times) // 2]


def gather_profiles(mine: RankProfile, tp: int, device: torch.device) -> list[RankProfile]:
    """Every rank's profile, rank 0 first, on every rank (collective)."""
    local = torch.tensor(mine.as_tuple(), dtype=torch.float64, device=device)
    table = [torch.zeros_like(local) for _ in range(tp)]
    dist.all_gather(table, local)
    return [RankProfile(*row.tolist()) for row in table]


def broadcast_partition(partition: Partition | None, tp: int, device: torch.device) -> Partition | None:
    """Rank 0's partition on every rank (None: rank 0 found none that fits; collective)."""
    shares = torch.zeros(2 * tp + 1, dtype=torch.int64, device=device)
    if partition is not None:
        shares[0] = 1
        shares[1:] = torch.tensor([*partition.kv_groups, *partition.mlp_columns])
    dist.broadcast(shares, src=0)
    values = shares.tolist()
    if not values[0]:
        return None
    return Partition(tuple(values[1 : tp + 1]), tuple(values[tp + 1 :]))


def _bytes(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PartitionError(RuntimeError):
    """No uneven split of the layers fits the group's ranks (a one-line reason)."""


@dataclass(frozen=True)
class Agreed:
    """The group's split, and on rank 0 the problem and the LP's answer it came from."""

    partition: Partition
    problem: HeptiProblem | None = None
    split: HeptiSplit | None = None


def agree_partition(
    rank: int,
    tp: int,
    device: torch.device,
    dtype: torch.dtype,
    config,
    num_layers: int,
    quant: str,
    clock: ComputeClock,
) -> Agreed:
    """Profiles this rank, gathers every rank's profile, and returns the split rank 0 solved
    (collective: every rank of the group calls it right after joining)."""
    share = max(1, config.intermediate_size // tp)
    profile = RankProfile(
        measure_flops_in_turn(rank, tp, device, dtype, config.hidden_size, share, clock),
        free_bytes(device, tp),
        *measure_link(rank, tp, device),
    )
    all_reduce_s = measure_all_reduce(config.hidden_size, share, dtype, device)
    profiles = calibrate_links(
        gather_profiles(profile, tp, device), all_reduce_s, config.hidden_size * _bytes(dtype)
    )
    problem = split = None
    reason = "rank 0 found no split that fits"
    if rank == 0:
        shape = layer_shape(config.to_dict(), num_layers, bytes_per_weight(quant, _bytes(dtype)))
        problem = hepti_problem(shape, profiles)
        try:
            split = plan_split(problem)
        except HeptiInfeasibleError as e:
            reason = str(e)
    partition = broadcast_partition(partition_of(split) if split else None, tp, device)
    if partition is None:
        raise PartitionError(reason)
    return Agreed(partition, problem, split)


def first_partition(setup: RankSetup, device: torch.device, spec, clock: ComputeClock) -> Agreed | None:
    """With `--partition auto`, the split the group agrees on after profiling (collective)."""
    if setup.partition != "auto":
        return None
    return agree_partition(
        setup.rank, setup.tp, device, setup.dtype, spec.config, setup.end - setup.start, setup.quant, clock
    )


def log_agreed(agreed: Agreed) -> None:
    """The leader's log of the ranks' profiles and of the split they agreed on."""
    devices = agreed.problem.devices
    logger.info(
        "profiled ranks: %s GFLOP/s, %s GiB free, all-reduce %.0f us a layer",
        [round(d.flops / 1e9, 2) for d in devices],
        [round(d.free_bytes / 2**30, 1) for d in devices],
        sum(agreed.problem.comm_s(i) for i in range(1, len(devices))) / agreed.problem.shape.num_layers * 1e6,
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
