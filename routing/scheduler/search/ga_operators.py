"""Operators of HexGen's genetic search (§4.3): K-means + elbow initial groups, merge / split /
swap mutations with early rejection, and the random mutation of the §5.4 ablation.

An individual is a partition of device indices into groups; each group is one candidate
pipeline (a model replica). With `whole_machines` (a swarm, where a peer is one process, one TP
group on one machine) every operator moves whole machines, so a machine's devices always share
a group, and the DP then gives each machine at most one stage (`algorithm1.dp(whole_buckets)`). Groups are sorted tuples and an individual is a sorted tuple of
groups, so equal partitions compare equal. A group too small to hold the model is allowed in
an individual (its devices stay idle, available to later merges and swaps).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Sequence

import numpy as np
from scipy.cluster.vq import kmeans2

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import weight_memory
from hexswarm.routing.scheduler.model_spec import ModelSpec

Group = tuple[int, ...]
Individual = tuple[Group, ...]


def canonical(groups: Sequence[Sequence[int]]) -> Individual:
    return tuple(sorted(tuple(sorted(g)) for g in groups if len(g)))


def comm_features(cluster: Cluster, devs: Sequence[int]) -> np.ndarray:
    """Rows of the latency and inverse-bandwidth matrices (A and B of §4.1), scaled to [0, 1]."""
    idx = np.ix_(np.asarray(devs), np.asarray(devs))
    latency = cluster.latency[idx]
    inv_bw = 1.0 / cluster.bandwidth[idx]
    parts = [m / m.max() if m.max() > 0 else m for m in (latency, inv_bw)]
    return np.hstack(parts)


def kmeans_groups(features: np.ndarray, k: int, seed: int) -> tuple[list[list[int]], float]:
    """Vanilla K-means (scipy) into k groups; returns the groups (positions) and the inertia."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an empty cluster only means fewer groups
        centroids, labels = kmeans2(features, k, seed=seed, minit="++")
    inertia = float(((features - centroids[labels]) ** 2).sum())
    groups: dict[int, list[int]] = {}
    for position, label in enumerate(labels):
        groups.setdefault(int(label), []).append(position)
    return list(groups.values()), inertia


def elbow_k(inertias: Sequence[float]) -> int:
    """The elbow of an inertia curve for K = 1..len: the point farthest below the chord."""
    n = len(inertias)
    if n <= 2:
        return n
    x = np.arange(1, n + 1, dtype=float)
    y = np.asarray(inertias, dtype=float)
    span = y[0] - y[-1]
    if span <= 0:
        return 1
    chord = y[0] - (x - 1) / (n - 1) * span
    return int(x[np.argmax(chord - y)])


def kmeans_init(
    cluster: Cluster, devs: Sequence[int], seed: int, max_k: int = 16
) -> tuple[int, dict[int, Individual]]:
    """§4.3 initialization: K-means over the communication matrix for K = 1..max_k; returns the
    elbow K and the partition for every K (callers seed the population with several)."""
    devs = list(devs)
    if len(devs) == 1:
        return 1, {1: ((devs[0],),)}
    features = comm_features(cluster, devs)
    partitions, inertias = {}, []
    for k in range(1, min(max_k, len(devs)) + 1):
        groups, inertia = kmeans_groups(features, k, seed)
        partitions[k] = canonical([[devs[p] for p in g] for g in groups])
        inertias.append(inertia)
    return elbow_k(inertias), partitions


class Mutator:
    """merge / split / swap of §4.3 over GPU-type vectors, rejecting offspring early."""

    def __init__(
        self,
        cluster: Cluster,
        model: ModelSpec,
        accept_group: Callable[[Group], bool],
        whole_machines: bool = False,
    ):
        types = sorted({d.type for d in cluster.devices})
        self.type_of = [types.index(d.type) for d in cluster.devices]  # the paper's GPU type index k
        self.machine_of = [(d.region, d.machine) for d in cluster.devices]
        # Memory and one copy of the weights, in the compute dtype's bytes (a quantized device's
        # memory counts for more of them: `cost_model.weight_memory`).
        self.memory = [weight_memory(d, model) for d in cluster.devices]
        self.replica_bytes = model.weight_bytes
        self.accept_group = accept_group  # False for groups too large for the DP
        self.whole_machines = whole_machines
        self.peers: dict[tuple[str, str], tuple[int, ...]] = {}  # machine -> its device indices
        for i, machine in enumerate(self.machine_of):
            self.peers[machine] = self.peers.get(machine, ()) + (i,)

    def unite(self, ind: Individual) -> Individual:
        """Whole machines: each machine's devices join the group of its lowest-numbered device."""
        if not self.whole_machines:
            return ind
        group_of = {d: n for n, g in enumerate(ind) for d in g}
        home: dict[tuple[str, str], int] = {}
        for d in sorted(group_of):
            home.setdefault(self.machine_of[d], group_of[d])
        groups: list[list[int]] = [[] for _ in ind]
        for d in group_of:
            groups[home[self.machine_of[d]]].append(d)
        return canonical(groups)

    def holds_replica(self, group: Sequence[int]) -> bool:
        return sum(self.memory[d] for d in group) >= self.replica_bytes

    def mutate(self, ind: Individual, rng: random.Random) -> Individual | None:
        ops = [self.split]
        if len(ind) >= 2:
            ops += [self.merge, self.swap]
        child = rng.choice(ops)(ind, rng)
        return None if child is None else self._checked(ind, child)

    def _checked(self, parent: Individual, child: Individual) -> Individual | None:
        """Whole machines kept together; there a child equal to its parent is no offspring."""
        if not self.whole_machines:
            return child
        child = self.unite(child)
        return None if child == parent else child

    def merge(self, ind: Individual, rng: random.Random) -> Individual | None:
        """tau^1, tau^2 -> tau^1 + tau^2."""
        i, j = rng.sample(range(len(ind)), 2)
        merged = ind[i] + ind[j]
        if not self.accept_group(merged):
            return None
        return canonical([g for n, g in enumerate(ind) if n not in (i, j)] + [merged])

    def split(self, ind: Individual, rng: random.Random) -> Individual | None:
        """tau -> (floor(tau/2), ceil(tau/2)) per GPU type; both halves must hold a replica."""
        candidates = [n for n, g in enumerate(ind) if len(g) >= 2]
        if not candidates:
            return None
        n = rng.choice(candidates)
        first, second = self.halves(ind[n])
        if not first or not self.holds_replica(first) or not self.holds_replica(second):
            return None  # early check of §4.3: no DP for offspring that cannot hold the model
        return canonical([g for m, g in enumerate(ind) if m != n] + [first, second])

    def halves(self, group: Group) -> tuple[list[int], list[int]]:
        """Per GPU type, floor(n/2) devices to the first half; devices taken machine by machine so
        that the halves split few machines (the paper's type vectors leave this choice open).
        With whole machines, machines go to the first half until it holds half the devices."""
        if self.whole_machines:
            return self._machine_halves(group)
        first: list[int] = []
        second: list[int] = []
        for members in self._by_type(group).values():
            members = sorted(members, key=lambda d: (self.machine_of[d], d))
            half = len(members) // 2
            first += members[:half]
            second += members[half:]
        return first, second

    def _machine_halves(self, group: Group) -> tuple[list[int], list[int]]:
        machines: dict[tuple[str, str], list[int]] = {}
        for d in sorted(group, key=lambda d: (self.type_of[d], self.machine_of[d], d)):
            machines.setdefault(self.machine_of[d], []).append(d)
        first: list[int] = []
        second: list[int] = []
        for members in machines.values():
            (first if len(first) + len(members) <= len(group) / 2 or not first else second).extend(members)
        if not second:  # one machine: nothing to split
            return [], first
        return first, second

    def repair(self, ind: Individual) -> Individual:
        """Splits groups too large for the DP until every group is accepted (initial groups only)."""
        todo, done = list(self.unite(ind)), []
        while todo:
            group = todo.pop()
            first, second = self.halves(group) if len(group) > 1 else ([], list(group))
            if self.accept_group(group) or not first:
                done.append(group)
            else:
                todo += [tuple(first), tuple(second)]
        return canonical(done)

    def swap(self, ind: Individual, rng: random.Random) -> Individual | None:
        """Moves one GPU of a sampled type k from tau^2 to tau^1 (one on a machine tau^1 uses, if any)."""
        i, j = rng.sample(range(len(ind)), 2)
        by_type = self._by_type(ind[j])
        members = by_type[rng.choice(sorted(by_type))]
        machines = {self.machine_of[d] for d in ind[i]}
        moved = max(members, key=lambda d: (self.machine_of[d] in machines, d))
        movers = set(self.peers[self.machine_of[moved]]) if self.whole_machines else {moved}
        receiver = ind[i] + tuple(sorted(movers))
        if not self.accept_group(receiver):
            return None
        donor = tuple(d for d in ind[j] if d not in movers)
        return canonical([g for n, g in enumerate(ind) if n not in (i, j)] + [receiver, donor])

    def random_move(self, ind: Individual, rng: random.Random) -> Individual | None:
        """§5.4 ablation: one random device to a random (possibly new) group, no checks."""
        groups = [list(g) for g in ind]
        source = rng.randrange(len(groups))
        device = groups[source][rng.randrange(len(groups[source]))]
        movers = self.peers[self.machine_of[device]] if self.whole_machines else (device,)
        groups[source] = [d for d in groups[source] if d not in movers]
        target = rng.randrange(len(groups) + 1)
        if target == len(groups):
            groups.append(list(movers))
        else:
            groups[target].extend(movers)
        return canonical(groups)

    def _by_type(self, group: Group) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for d in group:
            out.setdefault(self.type_of[d], []).append(d)
        return out
