"""A seeded churn process: volunteer peers joining and leaving a swarm of about N GPUs.

Peers are machines of the synthetic swarm (`synthetic_cluster.py`: the catalog's consumer and
datacenter GPUs, 1-8 of one type per machine, regions with HexGen footnote 3's links), drawn in
a random order from a pool several times the swarm's size. Each peer stays for a session drawn
from an exponential law (mean `mean_session_s`, 30 min for a volunteer by default). The first
peers, up to `gpus` GPUs, are there at t = 0; newcomers arrive as a Poisson process of rate
n / mean_session (n = the first peers' count), which keeps the expected population at n
peers: an M/M/infinity queue in its steady state (the first peers' remaining sessions are
exponential too, as the law has no memory).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hexswarm.routing.scenarios.synthetic_cluster import synthetic_cluster
from hexswarm.routing.scheduler.cluster import Cluster

POOL_FACTOR = 4  # the pool holds this many times the swarm's GPUs (joiners come from it)


@dataclass(frozen=True)
class ChurnEvent:
    time_s: float
    kind: str  # "join" or "leave"
    machine: str


@dataclass(frozen=True, eq=False)
class Churn:
    """The pool of devices, the peers present at t = 0 and the events of the run, in time order."""

    pool: Cluster
    devices: dict[str, tuple[str, ...]]  # machine -> its device ids
    initial: tuple[str, ...]
    events: tuple[ChurnEvent, ...]
    duration_s: float

    def present(self, time_s: float) -> set[str]:
        """The machines present just after `time_s` (events at time_s included)."""
        machines = set(self.initial)
        for event in self.events:
            if event.time_s > time_s:
                break
            (machines.add if event.kind == "join" else machines.discard)(event.machine)
        return machines

    def cluster(self, machines: set[str] | frozenset[str]) -> Cluster:
        return self.pool.subset(frozenset(d for m in machines for d in self.devices[m]))


def draw_churn(
    gpus: int = 200, regions: int = 6, minutes: float = 60.0, mean_session_s: float = 1800.0, seed: int = 0
) -> Churn:
    """The same churn for the same arguments (module docstring)."""
    if gpus < regions or minutes <= 0 or mean_session_s <= 0:
        raise ValueError("need gpus >= regions, a positive duration and a positive mean session")
    pool = synthetic_cluster(POOL_FACTOR * gpus, regions, seed=seed)
    devices: dict[str, tuple[str, ...]] = {}
    for d in pool.devices:
        devices[d.machine] = devices.get(d.machine, ()) + (d.id,)
    rng = np.random.default_rng(seed + 1)
    order = [str(m) for m in rng.permutation(sorted(devices))]
    initial, count = [], 0
    while count < gpus:
        initial.append(order.pop(0))
        count += len(devices[initial[-1]])
    duration = minutes * 60.0
    events = [ChurnEvent(float(rng.exponential(mean_session_s)), "leave", m) for m in initial]
    arrival_rate = len(initial) / mean_session_s
    t = float(rng.exponential(1.0 / arrival_rate))
    while t < duration and order:
        machine = order.pop(0)
        events.append(ChurnEvent(t, "join", machine))
        events.append(ChurnEvent(t + float(rng.exponential(mean_session_s)), "leave", machine))
        t += float(rng.exponential(1.0 / arrival_rate))
    kept = sorted((e for e in events if e.time_s < duration), key=lambda e: (e.time_s, e.kind, e.machine))
    return Churn(pool, devices, tuple(initial), tuple(kept), duration)


def split_machines(churn: Churn, gpus_per_peer: int) -> Churn:
    """The same churn where each machine runs one peer per `gpus_per_peer` of its GPUs (the
    last peer takes the remainder): the devices' `machine` label becomes the peer's, so the
    scheduler plans one stage per peer, while links keep their measured classes (two peers of
    one machine still talk over its bus) and machines still join and leave whole."""
    if gpus_per_peer < 1:
        raise ValueError(f"gpus_per_peer must be at least 1, not {gpus_per_peer}")
    peer_of = {
        device: f"{machine}.p{k // gpus_per_peer}"
        for machine, ids in churn.devices.items()
        for k, device in enumerate(ids)
    }
    devices = tuple(replace(d, machine=peer_of[d.id]) for d in churn.pool.devices)
    pool = Cluster(devices, churn.pool.latency, churn.pool.bandwidth, churn.pool.network)
    return replace(churn, pool=pool)
