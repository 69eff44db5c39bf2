"""A plan's stages -> per-peer assignments that move as few peers, and load as few layers, as they can.

The scheduler places stages on particular peers, but peers of one kind (same region, same
hardware, same stated capacity) are interchangeable: any of them can take any of their kind's
stages with the same estimate. So among each kind we re-match peers to stages with the
Hungarian method (scipy's linear_sum_assignment), each pairing costing the layers the peer
would have to load (0 when it already serves that range), which is what a move costs: the
time to load its new layers. Peers the plan leaves without a stage keep their range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from routing.scheduler.cluster import Device

Range = tuple[int, int]


@dataclass(frozen=True)
class Move:
    peer_id: str
    old: Range
    new: Range


def kind_of(device: Device) -> tuple:
    """Peers whose figures agree within ~25 % (measurements are noisy) count as one kind."""

    def bucket(x: float) -> int:
        return round(math.log(max(x, 1e-12)) / math.log(1.25))

    return (
        device.region,
        device.type,
        bucket(device.memory_bytes),
        bucket(device.flops),
        bucket(device.bandwidth),
    )


def layers_to_load(current: Range | None, target: Range) -> int:
    """Layers of `target` that a peer serving `current` does not hold yet."""
    if current is None:
        return target[1] - target[0]
    overlap = max(0, min(current[1], target[1]) - max(current[0], target[0]))
    return (target[1] - target[0]) - overlap


def rematch(
    placed: Mapping[str, Range], current: Mapping[str, Range], devices: Sequence[Device]
) -> dict[str, Range]:
    """Re-assigns `placed` (peer -> planned range) among interchangeable peers to load the fewest layers.

    Each peer of `devices` ends with one range: a planned one, or its `current` one if the plan
    gives its kind fewer stages than peers.
    """
    kinds: dict[tuple, list[str]] = {}
    for d in devices:
        kinds.setdefault(kind_of(d), []).append(d.id)
    result: dict[str, Range] = {}
    for peers in kinds.values():
        slots = [placed[p] for p in peers if p in placed]
        cost = np.array([[layers_to_load(current.get(p), s) for s in slots] for p in peers], dtype=float)
        # A peer can also stay idle in the plan (keep its range) when there are more peers than slots.
        idle = np.full((len(peers), len(peers) - len(slots)), 0.0)
        rows, cols = linear_sum_assignment(np.hstack([cost, idle]) if idle.size else cost)
        for r, c in zip(rows, cols, strict=True):
            peer = peers[r]
            if c < len(slots):
                result[peer] = slots[c]
            elif peer in current:
                result[peer] = current[peer]
    return result


def diff(current: Mapping[str, Range], assigned: Mapping[str, Range]) -> list[Move]:
    """The peers whose assigned range differs from the one they serve."""
    return [
        Move(peer, current.get(peer, (0, 0)), new)
        for peer, new in sorted(assigned.items())
        if current.get(peer) != new
    ]
