"""Hepti's problem P2 (§4.3, Eq. 9-10) as a mixed-integer LP, solved by HiGHS (scipy's `milp`).

Why an LP at all: the even split that `--tp K` makes leaves a fast rank waiting on a slow one at
every step. Hepti sizes each device's share a_i so that every device finishes together, under
its memory. P1 (Eq. 1-7) is not linear because of the max in Eq. 7 and the integer a_i; P2
writes a_i = lambda_i x whole (Eq. 9, sum lambda_i = 1, Eq. 10) and an epigraph variable per
block for the max. Per device i and block b (attention: KV-head groups g_i; MLP: column tiles c_i):

    min  T_att + T_mlp
    s.t. sum_i g_i = G,  sum_i c_i = C                         (Eq. 1, 9-10)
         g_i, c_i integer >= 0 (>= 1 with every_device)         (Eq. 2)
         g_i <= G zg_i,  c_i <= C zc_i,  z binary              (i takes part in b)
         F_att g_i / f_i + sum_j x_j zg_j <= T_att             (Eq. 5-7)
         F_mlp c_i / f_i + sum_j x_j zc_j <= T_mlp
         B_att g_i + B_mlp c_i <= s_i        (tiled modes only: Eq. 4)

with F the FLOPs and B the weight bytes of one unit and x_j device j's all-reduce time (Eq. 6,
summed: the links to the leader carry one after the other). `solve_milp` solves it exactly
(small groups); `solve_relaxed` follows §4.3's algorithm for large ones: the LP with every
device in, devices whose lambda_i comes out 0 dropped and the LP solved again, and the shares
rounded, here by largest remainder so that sums stay exact and memory holds.
"""

from __future__ import annotations

import math

import numpy as np

from hexswarm.routing.hepti.problem import GROUP, TILE, HeptiProblem

Shares = tuple[list[int], list[int]]  # (KV-head groups per device, MLP tiles per device)


def _time_scale(problem: HeptiProblem) -> float:
    """Seconds of the ideal split (all FLOPs over all speeds): times are solved in this unit so
    that HiGHS's tolerances are relative to the step, not to one second."""
    work = problem.groups * problem.flops(GROUP) + problem.tiles * problem.flops(TILE)
    return work / sum(d.flops for d in problem.devices)


def _solve(problem: HeptiProblem, memory: bool, integral: bool, fixed: Shares | None = None) -> Shares | None:
    """P2 by HiGHS. Variables: g (n), c (n), zg (n), zc (n), T_att, T_mlp. `fixed` (0/1 per
    device and block) pins who takes part, which makes the problem an LP over the shares alone.
    None when no split satisfies the constraints."""
    # here, not at the top: scipy.optimize costs 0.4 s of every peer's start, and only uneven
    # tensor-parallel splits solve this
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, G, C = len(problem.devices), problem.groups, problem.tiles
    tau = _time_scale(problem)
    x = np.array([problem.comm_s(i) for i in range(n)]) / tau
    f = np.array([d.flops for d in problem.devices])
    rows, lo, hi = [], [], []

    def row(entries: dict[int, float], low: float, high: float) -> None:
        r = np.zeros(4 * n + 2)
        for k, v in entries.items():
            r[k] += v
        rows.append(r)
        lo.append(low)
        hi.append(high)

    row({i: 1.0 for i in range(n)}, G, G)
    row({n + i: 1.0 for i in range(n)}, C, C)
    for i in range(n):
        row({i: 1.0, 2 * n + i: -G}, -np.inf, 0.0)
        row({n + i: 1.0, 3 * n + i: -C}, -np.inf, 0.0)
        row(
            {i: problem.flops(GROUP) / f[i] / tau, **{2 * n + j: x[j] for j in range(n)}, 4 * n: -1.0},
            -np.inf,
            0.0,
        )
        row(
            {n + i: problem.flops(TILE) / f[i] / tau, **{3 * n + j: x[j] for j in range(n)}, 4 * n + 1: -1.0},
            -np.inf,
            0.0,
        )
        if memory:  # Eq. 4, in units of the device's free memory
            s = max(problem.devices[i].free_bytes, 1.0)
            row({i: problem.weight_bytes(GROUP) / s, n + i: problem.weight_bytes(TILE) / s}, -np.inf, 1.0)
    lower = np.zeros(4 * n + 2)
    lower[: 2 * n] = problem.least_units
    upper = np.array([G] * n + [C] * n + [1.0] * 2 * n + [np.inf] * 2)
    if fixed is not None:
        lower[2 * n : 4 * n] = upper[2 * n : 4 * n] = np.array([*fixed[0], *fixed[1]], dtype=float)
    integrality = np.array([1] * 4 * n + [0, 0]) if integral else np.zeros(4 * n + 2)
    cost = np.zeros(4 * n + 2)
    cost[4 * n :] = 1.0
    result = milp(
        cost,
        integrality=integrality,
        bounds=Bounds(lower, upper),
        constraints=LinearConstraint(np.array(rows), lo, hi),
        options={"mip_rel_gap": 1e-9, "time_limit": 30.0},
    )
    if result.x is None:
        return None
    return [float(v) for v in result.x[:n]], [float(v) for v in result.x[n : 2 * n]]


def solve_milp(problem: HeptiProblem, memory: bool) -> Shares | None:
    """The integer form of P2, solved exactly; None when it is infeasible."""
    shares = _solve(problem, memory, integral=True)
    if shares is None:
        return None
    return [round(v) for v in shares[0]], [round(v) for v in shares[1]]


def solve_relaxed(problem: HeptiProblem, memory: bool) -> Shares | None:
    """§4.3's algorithm for groups too large for the integer form: solve the LP with every
    device taking part, drop the devices the LP leaves idle, or whose link costs more than its
    compute saves, solve again, round, and polish the rounding. None when no split fits."""
    n = len(problem.devices)
    active = [1] * n, [1] * n
    shares = _solve(problem, memory, integral=False, fixed=active)
    if shares is None:
        return None
    first = _round(problem, shares, memory)
    best = problem.step_time(*first)[0] if first else math.inf
    improved = True
    while improved and not problem.every_device:  # drop a block's least-used device while that helps
        improved = False
        for block in (0, 1):
            candidates = [i for i in range(1, n) if active[block][i]]
            for i in sorted(candidates, key=lambda i: shares[block][i]):
                trial = ([*active[0]], [*active[1]])
                trial[block][i] = 0
                tried = _solve(problem, memory, integral=False, fixed=trial)
                rounded = _round(problem, tried, memory) if tried else None
                if rounded and problem.step_time(*rounded)[0] < best * (1 - 1e-9):
                    active, shares, best, improved = trial, tried, problem.step_time(*rounded)[0], True
                    break
    rounded = _round(problem, shares, memory)
    return _polish(problem, rounded, memory) if rounded else None


def _polish(problem: HeptiProblem, shares: Shares, memory: bool) -> Shares:
    """Rounding can leave a block's slowest device a unit too many (a KV-head group is a large
    unit when there are few): move single units off it while the step gets shorter and memory
    holds. Sums stay exact; each move lowers T, so this ends."""
    groups, tiles = [*shares[0]], [*shares[1]]
    best = problem.step_time(groups, tiles)[0]
    improved = True
    while improved:
        improved = False
        for units in (groups, tiles):
            slowest = max(range(len(units)), key=lambda i: units[i] / problem.devices[i].flops)
            for j in range(len(units)):
                if j == slowest or units[slowest] <= problem.least_units:
                    continue
                units[slowest] -= 1
                units[j] += 1
                time = problem.step_time(groups, tiles)[0]
                if time < best * (1 - 1e-9) and (not memory or problem.split_fits(groups, tiles)):
                    best, improved = time, True
                    break
                units[slowest] += 1
                units[j] -= 1
    return groups, tiles


def _round(problem: HeptiProblem, shares: Shares, memory: bool) -> Shares | None:
    """Whole units by largest remainder: floors first, then one more unit each to the devices
    with the largest fractions that still have memory for it (Eq. 4); the sums stay exact.
    None when the remainder fits nowhere."""
    groups = [math.floor(v + 1e-9) for v in shares[0]]
    tiles = [math.floor(v + 1e-9) for v in shares[1]]
    if memory and not problem.split_fits(groups, tiles):
        return None
    for block, units, whole, values in (
        (GROUP, groups, problem.groups, shares[0]),
        (TILE, tiles, problem.tiles, shares[1]),
    ):
        order = sorted(range(len(units)), key=lambda i: (-(values[i] - units[i]), -problem.devices[i].flops))
        for _ in range(whole - sum(units)):
            for i in order:
                g, c = (groups[i] + 1, tiles[i]) if block == GROUP else (groups[i], tiles[i] + 1)
                if not memory or problem.memory_fits(i, g, c):
                    units[i] += 1
                    order.remove(i)
                    order.append(i)  # the next unit goes to the next-largest fraction
                    break
            else:
                return None
    return groups, tiles
