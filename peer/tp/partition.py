"""Hepti's uneven split for a live tensor-parallel group, and re-splitting it from what is observed.

At start (`run-peer --tp K --partition auto`) each rank profiles itself (peer/tp/profile.py); the
leader turns the profiles into Hepti's problem P2 for the layers it serves and solves it with
routing/hepti (§4.3: the mode by free memory, then the shares). The shares become a `Partition`
(KV-head groups and MLP columns per rank) that every rank loads (peer/tp/shard.py).

While serving, `Repartitioner` compares each rank's observed compute per decode step with what
the LP predicted from the profiles. When one differs by more than `margin` for `sustain` checks
in a row, it re-solves with the observed speeds; if the new split is predicted to be at least
`min_gain` faster, the group loads it beside the old one and switches between steps
(peer/tp/group.py). Otherwise the observed speeds become the new baseline.

No torch here: plain numbers in, plain numbers out, so the decisions are unit-tested alone.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from hexswarm.peer.tp.shard import Partition
from hexswarm.routing.hepti import problem as hepti
from hexswarm.routing.hepti.split import HeptiSplit, plan_split

PARTITIONS = ("even", "auto")


@dataclass(frozen=True)
class RankProfile:
    """One rank as measured at start (Hepti §4.3's f_i, s_i, BW_i and a link latency)."""

    flops: float
    free_bytes: float
    latency_s: float
    bandwidth: float

    def as_tuple(self) -> tuple[float, float, float, float]:
        return (self.flops, self.free_bytes, self.latency_s, self.bandwidth)


def layer_shape(config: dict[str, Any], num_layers: int, weight_bytes: float) -> hepti.LayerShape:
    """The shape of the layers a peer serves, weights counted at `weight_bytes` each."""
    shape = hepti.LayerShape.from_hf_config(config, num_layers)
    # LayerShape counts whole bytes; a quantized peer's fraction rounds up (memory errs safe)
    return dataclasses.replace(shape, dtype_bytes=max(1, math.ceil(weight_bytes)))


def calibrate_links(
    profiles: list[RankProfile], all_reduce_s: float, activation_bytes: float
) -> list[RankProfile]:
    """The links scaled so that Hepti's all-reduce through the leader (Eq. 6: each rank's partial
    sum up and the sum back, one link after another) costs what the group's own all-reduce was
    measured to: the ping-pongs keep which links are slower, the measured collective sets the
    total (a ring or tree all-reduce is not the star Eq. 6 assumes, and idle ranks on shared cores
    wake slower in a collective than in a ping-pong)."""
    modelled = sum(2 * activation_bytes / p.bandwidth + 2 * p.latency_s for p in profiles[1:])
    if not (modelled > 0 and math.isfinite(modelled) and all_reduce_s > 0):
        return profiles
    scale = all_reduce_s / modelled
    return [profiles[0]] + [
        dataclasses.replace(p, latency_s=p.latency_s * scale, bandwidth=p.bandwidth / scale)
        for p in profiles[1:]
    ]


def hepti_problem(shape: hepti.LayerShape, profiles: list[RankProfile]) -> hepti.HeptiProblem:
    """P2 for the group: every rank keeps at least a KV head and a column tile (its layers
    cannot be empty), decode steps of one token."""
    devices = tuple(
        hepti.Device(
            name=f"rank{i}",
            flops=p.flops,
            free_bytes=p.free_bytes,
            bandwidth=p.bandwidth if i else math.inf,
            latency_s=p.latency_s if i else 0.0,
        )
        for i, p in enumerate(profiles)
    )
    return hepti.HeptiProblem(devices, shape, tokens=1, every_device=True)


def partition_of(split: HeptiSplit) -> Partition:
    return Partition(tuple(s.kv_groups for s in split.shares), tuple(s.mlp_columns for s in split.shares))


def units(problem: hepti.HeptiProblem, partition: Partition) -> tuple[list[int], list[int]]:
    """`partition` in the problem's units: KV-head groups and MLP tiles per rank."""
    return list(partition.kv_groups), [c // problem.tile_width for c in partition.mlp_columns]


def predicted_compute_s(problem: hepti.HeptiProblem, partition: Partition) -> list[float]:
    """Each rank's compute per decode step under `partition` (Eq. 5), from the problem's speeds."""
    groups, tiles = units(problem, partition)
    return [
        (g * problem.flops(hepti.GROUP) + c * problem.flops(hepti.TILE)) / d.flops
        for d, g, c in zip(problem.devices, groups, tiles, strict=True)
    ]


def step_time_s(problem: hepti.HeptiProblem, partition: Partition) -> float:
    """The group's step under `partition` (Eq. 7)."""
    return problem.step_time(*units(problem, partition))[0]


@dataclass(frozen=True)
class DriftPolicy:
    margin: float = 0.2  # |observed / predicted - 1| beyond which a rank has drifted
    sustain: int = 3  # consecutive checks with a drifted rank before re-solving
    min_steps: int = 5  # decode steps a check needs to count
    min_gain: float = 0.08  # a re-split must be predicted this much faster to be worth a move


class Repartitioner:
    """The leader's drift check: `check` once per window with each rank's observed compute."""

    def __init__(self, problem: hepti.HeptiProblem, partition: Partition, policy: DriftPolicy | None = None):
        self.problem, self.partition = problem, partition
        self.policy = policy or DriftPolicy()
        self.strikes = 0
        self.last_split: HeptiSplit | None = None  # the LP's answer behind the last proposal

    @property
    def predicted(self) -> list[float]:
        return predicted_compute_s(self.problem, self.partition)

    def check(self, observed_s: list[float], steps: int) -> Partition | None:
        """A better partition to switch to, or None. `observed_s`: mean compute per decode step
        of each rank over the window's `steps` steps."""
        if steps < self.policy.min_steps or len(observed_s) != len(self.partition.kv_groups):
            return None
        if not all(math.isfinite(s) and s > 0 for s in observed_s):
            return None
        ratios = [o / p for o, p in zip(observed_s, self.predicted, strict=True)]
        self.strikes = self.strikes + 1 if max(abs(r - 1) for r in ratios) > self.policy.margin else 0
        if self.strikes < self.policy.sustain:
            return None
        self.strikes = 0
        observed = dataclasses.replace(
            self.problem,
            devices=tuple(
                dataclasses.replace(d, flops=d.flops / r)
                for d, r in zip(self.problem.devices, ratios, strict=True)
            ),
        )
        self.last_split = plan_split(observed)
        candidate = partition_of(self.last_split)
        self.problem = observed  # the observed speeds are the baseline from now on
        if step_time_s(observed, candidate) < step_time_s(observed, self.partition) * (
            1 - self.policy.min_gain
        ):
            return candidate
        return None

    def weight_share(self, rank: int) -> float:
        """The fraction of a block's split weights that `rank` holds under the current partition."""
        p = self.problem
        groups, tiles = units(p, self.partition)
        weights = [
            g * p.weight_bytes(hepti.GROUP) + c * p.weight_bytes(hepti.TILE)
            for g, c in zip(groups, tiles, strict=True)
        ]
        return weights[rank] / sum(weights)

    def adopt(self, partition: Partition) -> None:
        """The group now serves `partition`."""
        self.partition, self.strikes = partition, 0
