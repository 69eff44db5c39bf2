"""The linear program shared by the throughput bound (`upper_bound.py`) and the SLO bound (`slo_bound.py`).

Both bound the generated tokens/s T of any placement by spreading device classes over LP
*cells*. A cell is one way a device of a class can work: at a batch level b_k (and, for the SLO
bound, in a TP group of some degree). Per cell the variables are
    N  devices of the class working this way     Y  decode layer-tokens/s they process
    Z  prefill layer-tokens/s                    W  weight scans/s, in layers
    H  layer-equivalents of weights they hold
and the rows (`upper_bound.py`'s docstring derives them) are
    busy_Y Y + busy_Z Z + busy_W W <= N          each device busy <= 1 s per second
    Y <= b_k W                                   a scan serves at most b_k tokens
    H <= N cap                                   weights + KV of the batch fit (Eq. 7)
    rho Y <= Z                                   prefill and decode on the same devices
    sum over a class's cells of N <= n_g         devices of each class
    sum H >= L;  sum Y >= L T;  sum Z >= L T s_in / s_out
and, for the SLO bound only, the deadline row
    sum (lambda Y + mu Z) <= D T / s_out         latency of the met requests <= D x their number.
The callers differ only in their cells' costs; this module builds and solves the program once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from hexswarm.routing.scheduler.model_spec import ModelSpec

DEFAULT_MAX_BATCH = 16  # the serving model's default (decode steps a stage batches)
_VARS = 5  # per cell: N, Y, Z, W, H


@dataclass(frozen=True)
class UpperBound:
    """The bound and where the optimum spends device time (shares of all devices' seconds)."""

    tok_s: float  # generated tokens per second
    requests_s: float  # completed requests per second (tok_s / s_out)
    prefill_share: float  # device time in prefill FLOPs / all device time
    decode_flops_share: float  # ... in decode FLOPs
    scan_share: float  # ... in decode weight scans (memory bandwidth)
    mean_batch: float  # decode tokens per weight scan at the optimum
    memory_binds: bool  # storing one replica (weights + KV of the batches) limits the bound
    solve_s: float  # wall-clock time of building and solving the LP

    @property
    def binding(self) -> str:
        """Which resource limits the bound, in words."""
        if self.tok_s == 0.0:
            return "memory: the cluster cannot hold one replica with KV for one sequence"
        compute = self.prefill_share + self.decode_flops_share
        kind = "compute (FLOPs)" if compute >= self.scan_share else "memory bandwidth (weight scans)"
        return kind + (", with memory for weights and KV" if self.memory_binds else "")


@dataclass(frozen=True)
class BoundCells:
    """The LP's cells and their per-unit costs."""

    cls: np.ndarray  # (C,) device class of the cell
    level: np.ndarray  # (C,) batch size b_k
    cap: np.ndarray  # (C,) layer-equivalents one device may hold at the level
    busy: np.ndarray  # (C, 3) device seconds per unit of Y, Z, W
    latency: np.ndarray | None = None  # (C, 2) request seconds per Y and per Z (SLO bound only)


@dataclass(frozen=True)
class Deadline:
    """The SLO bound's extra row: met requests' latency fits D each."""

    seconds: float


def batch_levels(max_batch: int) -> np.ndarray:
    """Every batch size up to 32, then powers of two, and max_batch itself (few LP columns)."""
    powers = [2**i for i in range(int(np.log2(max_batch)) + 1)]
    return np.array(sorted(set(range(1, min(max_batch, 32) + 1)) | set(powers) | {max_batch}), dtype=float)


def level_caps(
    memory: np.ndarray,
    levels: np.ndarray,
    model: ModelSpec,
    kv_tokens: float,
    layer_bytes: np.ndarray | None = None,
) -> np.ndarray:
    """(G, K) layer-equivalents a device may hold at level k: weights + KV of b_{k-1} + 1 sequences.
    A device whose memory admits b sequences sits at the level with b_{k-1} < b <= b_k.
    `layer_bytes`: (G,) one layer's weights in each class's format; None: `model.layer_bytes`."""
    kv_bytes = 2.0 * model.kv_width * model.dtype_bytes * kv_tokens  # one sequence, one layer
    previous = np.concatenate(([0.0], levels[:-1]))
    weights = model.layer_bytes if layer_bytes is None else layer_bytes[:, None]
    return memory[:, None] / (weights + (previous[None, :] + 1.0) * kv_bytes)


def solve_bound(
    count: np.ndarray,
    cells: BoundCells,
    layers: int,
    s_out: int,
    prompts: tuple[float, float],
    deadline: Deadline | None = None,
) -> UpperBound:
    """Solves the program with HiGHS. `count`: devices per class; `prompts`: (prompt charged per
    request, prompt of the per-device coupling rho * s_out)."""
    started = time.perf_counter()
    result = linprog(**_program(count, cells, layers, s_out, prompts, deadline), method="highs")
    if result.status == 2:  # infeasible: not even one replica fits
        return UpperBound(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, True, time.perf_counter() - started)
    if result.status != 0:
        raise RuntimeError(f"upper-bound LP failed: {result.message}")
    replica_row = len(cells.cls) * 4 + len(count)
    memory_binds = abs(float(result.ineqlin.marginals[replica_row])) > 1e-9
    return _summarise(result.x, cells, float(count.sum()), s_out, memory_binds, time.perf_counter() - started)


def _program(
    count: np.ndarray,
    cells: BoundCells,
    layers: int,
    s_out: int,
    prompts: tuple[float, float],
    deadline: Deadline | None,
) -> dict:
    """linprog arguments; columns (cell, v) for v in N, Y, Z, W, H, then T (tokens/s) last."""
    s_in, coupled = prompts
    c_count, g_count = len(cells.cls), len(count)
    t_col = c_count * _VARS
    cell = np.arange(c_count)
    n, y, z, w, h = (cell * _VARS + v for v in range(_VARS))
    rows, cols, vals = [], [], []

    def add(row, column, value) -> None:
        rows.append(np.broadcast_to(np.asarray(row), np.shape(column)))
        cols.append(np.asarray(column))
        vals.append(np.broadcast_to(np.asarray(value, dtype=float), np.shape(column)))

    for column, v in ((y, 0), (z, 1), (w, 2)):
        add(cell, column, cells.busy[:, v])  # device seconds per second <= N
    add(cell, n, -1.0)
    add(c_count + cell, y, 1.0)  # Y <= b W
    add(c_count + cell, w, -cells.level)
    add(2 * c_count + cell, h, 1.0)  # H <= N cap
    add(2 * c_count + cell, n, -cells.cap)
    add(3 * c_count + cell, y, coupled / s_out)  # rho Y <= Z
    add(3 * c_count + cell, z, -1.0)
    base = 4 * c_count
    add(base + cells.cls, n, 1.0)  # devices of each class
    base += g_count
    add(base, h, -1.0)  # one replica stored
    add(base + 1, y, -1.0)  # every layer of every token decoded
    add(base + 1, [t_col], float(layers))
    add(base + 2, z, -1.0)  # ... and prefilled
    add(base + 2, [t_col], layers * s_in / s_out)
    limits = [np.zeros(4 * c_count), count, [-float(layers), 0.0, 0.0]]
    if deadline is not None:
        if cells.latency is None:
            raise ValueError("a deadline needs the cells' latencies")
        add(base + 3, y, cells.latency[:, 0])
        add(base + 3, z, cells.latency[:, 1])
        add(base + 3, [t_col], -deadline.seconds / s_out)
        limits.append([0.0])
    b_ub = np.concatenate(limits)
    a_ub = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(b_ub), t_col + 1)
    ).tocsr()
    objective = np.zeros(t_col + 1)
    objective[t_col] = -1.0  # maximise T
    return {"c": objective, "A_ub": a_ub, "b_ub": b_ub, "bounds": (0, None)}


def _summarise(
    x: np.ndarray, cells: BoundCells, devices: float, s_out: int, memory_binds: bool, solve_s: float
) -> UpperBound:
    tok_s = float(x[-1])
    v = x[:-1].reshape(len(cells.cls), _VARS)
    scan_count = float(v[:, 3].sum())
    mean_batch = float(v[:, 1].sum()) / scan_count if scan_count > 0 else 0.0
    # busy includes the SLO bound's all-reduce time, so there the shares are indicative only
    return UpperBound(
        tok_s,
        tok_s / s_out,
        float((v[:, 2] * cells.busy[:, 1]).sum()) / devices,
        float((v[:, 1] * cells.busy[:, 0]).sum()) / devices,
        float((v[:, 3] * cells.busy[:, 2]).sum()) / devices,
        mean_batch,
        memory_binds,
        solve_s,
    )
