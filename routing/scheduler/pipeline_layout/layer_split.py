"""How many layers each stage of a pipeline gets, once the DP has chosen its stages (HexGen §4.3).

Three splits of L layers over the stages, each within the stages' memory caps (Eq. 7):
  * proportional — to the stages' memory, §4.3's own partition rule;
  * greedy       — latency-optimal: fill the stages with the cheapest layers first, which
                   minimises Eq. 2 for one request alone (the sequential serving model);
  * balanced     — to the stages' speed, so every stage's step takes about as long: with
                   pipelining, a pipeline completes one batch per step of its slowest stage,
                   so balance is what throughput needs.
"""

from __future__ import annotations

from collections.abc import Sequence


def proportional_split(memory: Sequence[float], num_layers: int) -> list[int]:
    """Layers in proportion to each stage's memory (rounded at cumulative boundaries)."""
    total, acc, bounds = sum(memory), 0.0, [0]
    for m in memory:
        acc += m
        bounds.append(round(num_layers * acc / total))
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


def greedy_split(unit: Sequence[float], caps: Sequence[int], num_layers: int) -> list[int] | None:
    """Latency-optimal split: min sum(unit_j * l_j), sum l_j = L, 0 <= l_j <= cap_j."""
    split, left = [0] * len(unit), num_layers
    for j in sorted(range(len(unit)), key=lambda j: unit[j]):
        split[j] = min(caps[j], left)
        left -= split[j]
    return None if left else split


def balanced_split(unit: Sequence[float], caps: Sequence[int], num_layers: int) -> list[int] | None:
    """Layers in proportion to speed 1 / unit_j, water-filled under the caps, then rounded.

    Stages whose share would exceed their cap get the cap; the rest is shared again among the
    others. Rounding gives the leftover layers to the stages with the largest remainders that
    still have room. None when the caps cannot hold L layers.
    """
    if sum(caps) < num_layers:
        return None
    share = [0.0] * len(unit)
    free, left = set(range(len(unit))), float(num_layers)
    while free:
        speed = sum(1.0 / unit[j] for j in free)
        over = [j for j in free if left / speed / unit[j] > caps[j]]
        if not over:
            for j in free:
                share[j] = left / speed / unit[j]
            break
        for j in over:
            share[j] = caps[j]
            left -= caps[j]
            free.discard(j)
    split = [min(caps[j], int(share[j])) for j in range(len(unit))]
    order = sorted(range(len(unit)), key=lambda j: share[j] - int(share[j]), reverse=True)
    missing = num_layers - sum(split)
    for j in order * 2:
        if missing <= 0:
            break
        if split[j] < caps[j]:
            split[j] += 1
            missing -= 1
    return split if missing == 0 else None
