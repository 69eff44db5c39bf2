"""Hepti's partitioning engine (§4.3, "Algorithms"): the mode by free memory (§4.2), then P2.

1. Solve P2 with no memory bound. If every device can hold its share's weights for all the
   layers, the split runs weight-stationary (WS, §4.2): the shares are sized by speed alone.
2. Otherwise solve P2 again with Eq. 4 binding: the shares are tiled to fit each device's free
   memory. §4.3 picks 1D-tiled WS for fewer than 16 devices and 2D-tiled WS from 16 up (the
   2D mode tiles rows too; the LP sizes the column split that both share).
3. If no split fits even then, `HeptiInfeasibleError` says why in one line.

The integer form is solved exactly for up to `MILP_MAX_DEVICES` devices, the relaxation with
§4.3's rounding beyond that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexswarm.routing.hepti.lp import solve_milp, solve_relaxed
from hexswarm.routing.hepti.problem import GROUP, TILE, Device, HeptiProblem, LayerShape

SCHEMA_VERSION = 1
MODES = ("weight-stationary", "1d-tiled", "2d-tiled")
MILP_MAX_DEVICES = 8  # the integer form stays well under a second up to here
TILED_2D_FROM = 16  # §4.3: 2D-tiled WS from 16 devices up, 1D-tiled below


class HeptiInfeasibleError(ValueError):
    """No split of the layers fits the devices' memory in any mode (a one-line reason)."""


@dataclass(frozen=True)
class Share:
    """One device's part of every layer the group serves."""

    device: str
    kv_groups: int  # KV-head groups: kv_groups x heads_per_group attention heads
    heads: int  # attention (query) heads
    mlp_columns: int  # MLP columns, a multiple of the split's tile
    weight_bytes: float  # its share's weights over all layers (Eq. 4's r_i)
    free_bytes: float  # s_i
    compute_s: float  # its FLOPs / its speed, per step (Eq. 5)


@dataclass(frozen=True)
class HeptiSplit:
    """What Hepti's engine decides for a group: the mode, each device's share, the predicted step."""

    mode: str  # one of MODES
    shares: tuple[Share, ...]
    step_time_s: float  # T (Eq. 7): attention_s + mlp_s
    attention_s: float  # slowest device's attention compute + the attention all-reduces
    mlp_s: float
    even_step_time_s: float  # T of `--tp K`'s even split, for comparison (inf when it does not fit)
    tile: int  # MLP columns per tile
    layers: int
    tokens: int
    solver: str  # "milp" (exact) or "lp-rounded" (relaxation, §4.3's rounding)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "mode": self.mode,
            "step_time_s": self.step_time_s,
            "attention_s": self.attention_s,
            "mlp_s": self.mlp_s,
            "even_step_time_s": self.even_step_time_s if self.even_step_time_s != float("inf") else None,
            "tile": self.tile,
            "layers": self.layers,
            "tokens": self.tokens,
            "solver": self.solver,
            "shares": [vars(s) for s in self.shares],
        }


def plan_split(problem: HeptiProblem) -> HeptiSplit:
    """The mode and the shares for `problem` (steps 1-3 above)."""
    _check_total_memory(problem)
    solve = solve_milp if len(problem.devices) <= MILP_MAX_DEVICES else solve_relaxed
    solver = "milp" if len(problem.devices) <= MILP_MAX_DEVICES else "lp-rounded"
    shares = solve(problem, memory=False)
    if shares is not None and problem.split_fits(*shares):
        return _record(problem, shares, MODES[0], solver)
    shares = solve(problem, memory=True)
    if shares is None:
        raise HeptiInfeasibleError(_why_infeasible(problem))
    active = sum(1 for g, c in zip(*shares, strict=True) if g or c)
    return _record(problem, shares, MODES[2] if active >= TILED_2D_FROM else MODES[1], solver)


def even_split(problem: HeptiProblem) -> tuple[list[int], list[int]] | None:
    """`--tp K`'s split: every device the same number of units (None when they do not divide)."""
    n = len(problem.devices)
    if problem.groups % n or problem.tiles % n:
        return None
    return [problem.groups // n] * n, [problem.tiles // n] * n


def _record(problem: HeptiProblem, shares: tuple[list[int], list[int]], mode: str, solver: str) -> HeptiSplit:
    step, attention, mlp = problem.step_time(*shares)
    even = even_split(problem)
    even_fits = even and problem.split_fits(*even)
    per_group = problem.shape.heads_per_group
    return HeptiSplit(
        mode=mode,
        shares=tuple(
            Share(
                device=d.name,
                kv_groups=g,
                heads=g * per_group,
                mlp_columns=c * problem.tile_width,
                weight_bytes=g * problem.weight_bytes(GROUP) + c * problem.weight_bytes(TILE),
                free_bytes=d.free_bytes,
                compute_s=(g * problem.flops(GROUP) + c * problem.flops(TILE)) / d.flops,
            )
            for d, g, c in zip(problem.devices, *shares, strict=True)
        ),
        step_time_s=step,
        attention_s=attention,
        mlp_s=mlp,
        even_step_time_s=problem.step_time(*even)[0] if even_fits else float("inf"),
        tile=problem.tile_width,
        layers=problem.shape.num_layers,
        tokens=problem.tokens,
        solver=solver,
    )


def _check_total_memory(problem: HeptiProblem) -> None:
    need = problem.groups * problem.weight_bytes(GROUP) + problem.tiles * problem.weight_bytes(TILE)
    have = sum(d.free_bytes for d in problem.devices)
    if need > have:
        raise HeptiInfeasibleError(
            f"{problem.shape.num_layers} layers need {_size(need)} of weights; "
            f"the {len(problem.devices)} devices have {_size(have)} free"
        )


def _why_infeasible(problem: HeptiProblem) -> str:
    group = problem.weight_bytes(GROUP)
    if all(d.free_bytes < group for d in problem.devices):
        return (
            f"one KV-head group of {problem.shape.num_layers} layers needs {_size(group)}; "
            "no device has that much free"
        )
    return "no split into whole KV-head groups and MLP tiles fits every device's free memory"


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def problem_from_dict(raw: dict[str, Any], shape: LayerShape) -> HeptiProblem:
    """A group file's devices and settings (docs/scheduling.md, "Hepti") for the layers `shape`."""
    if not isinstance(raw, dict) or not isinstance(raw.get("devices"), list) or not raw["devices"]:
        raise ValueError('a Hepti group file holds an object with a non-empty "devices" list')
    known = {"name", "flops", "free_bytes", "bandwidth", "latency_s"}
    devices = []
    for k, d in enumerate(raw["devices"]):
        if not isinstance(d, dict) or not {"name", "flops", "free_bytes"} <= d.keys() or d.keys() - known:
            raise ValueError(f"device {k}: needs name, flops, free_bytes (optional: bandwidth, latency_s)")
        try:
            devices.append(Device(**{key: d[key] if key == "name" else float(d[key]) for key in d}))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"device {k}: {exc}") from exc
    return HeptiProblem(
        devices=tuple(devices), shape=shape, tokens=int(raw.get("tokens", 1)), tile=int(raw.get("tile", 64))
    )
