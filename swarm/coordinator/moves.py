"""A plan's stages -> per-peer placements that move as few peers, and load as few layers, as they can.

The scheduler places stages on particular peers, but peers of one kind (same region, same
offered TP degrees, same weight format, same per-device figures and stated capacity) are interchangeable: any of
them can take any of their kind's stages, at the stage's degree, with the same estimate. So
among each kind we re-match peers to stages with the Hungarian method (scipy's
linear_sum_assignment), each pairing costing the layers the peer would have to load, which is
what a move costs: the time to load its new layers. That is 0 when it already serves the range
at the degree, the layers it lacks when only the range changes, and all of the new range when
the degree changes (every rank's shard of every layer differs). Peers the plan leaves without a
stage keep their range and degree.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment

from hexswarm.routing.scheduler.cluster import Device
from hexswarm.swarm.trust.records import PeerRecord


class Placement(NamedTuple):
    """A peer's part of a plan: serve blocks [start, end) as a tensor-parallel group of `tp`."""

    start: int
    end: int
    tp: int

    @classmethod
    def of(cls, record: PeerRecord) -> Placement:
        """What a peer serves now, by its record."""
        return cls(record.start, record.end, record.tp)


@dataclass(frozen=True)
class Move:
    peer_id: str
    old: Placement | None  # None: it served nothing
    new: Placement


def kind_of(device: Device, degrees: tuple[int, ...] = ()) -> tuple:
    """Peers whose figures agree within ~25 % (measurements are noisy), that store their weights in
    the same format and offer the same TP `degrees` count as one kind; `device` is one
    representative device of the peer."""

    def bucket(x: float) -> int:
        return round(math.log(max(x, 1e-12)) / math.log(1.25))

    return (
        device.region,
        device.type,
        device.quant,
        degrees,
        bucket(device.memory_bytes),
        bucket(device.flops),
        bucket(device.bandwidth),
    )


def layers_to_load(current: Placement | None, target: Placement) -> int:
    """Layers of `target` that a peer serving `current` does not hold yet (all when its degree changes)."""
    if current is None or current.tp != target.tp:
        return target.end - target.start
    overlap = max(0, min(current.end, target.end) - max(current.start, target.start))
    return (target.end - target.start) - overlap


def rematch(
    placed: Mapping[str, Placement], current: Mapping[str, Placement], kinds: Mapping[str, Hashable]
) -> dict[str, Placement]:
    """Re-assigns `placed` (peer -> planned placement) among peers of one kind to load the fewest layers.

    `kinds`: every peer to place -> its kind (`kind_of`). Each ends with one placement: a planned
    one, or its `current` one if the plan gives its kind fewer stages than peers.
    """
    groups: dict[Hashable, list[str]] = {}
    for peer, kind in kinds.items():
        groups.setdefault(kind, []).append(peer)
    result: dict[str, Placement] = {}
    for peers in groups.values():
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


def diff(current: Mapping[str, Placement], assigned: Mapping[str, Placement]) -> list[Move]:
    """The peers whose assigned range or degree differs from what they serve."""
    return [
        Move(peer, current.get(peer), new)
        for peer, new in sorted(assigned.items())
        if current.get(peer) != new
    ]
