"""From the layer ranges peers serve to the pipelines that can serve requests (one rule for all
policies of the churn benchmark).

In a swarm every peer serves one range of layers; a request needs a chain of peers whose ranges
cover [0, L). The serving simulator (`serving.py`) takes disjoint pipelines, so the peers'
spans are decomposed into disjoint chains, greedily:

1. A chain starts at a free span that starts at layer 0: the one reaching farthest.
2. At layer p it continues with the free span that covers p (start <= p < end), one in the
   chain's region first (a cross-region hop costs 40-150 ms per decode step, HexGen footnote 3),
   then one that starts exactly at p (no layers wasted: a plan's pipelines come back whole),
   then the one that reaches farthest; that peer serves [p, end) (a part of its range when
   ranges overlap).
3. Chains are built until one cannot be completed (no free span covers some layer: no later
   chain could pass it either).

Each peer is in at most one chain, as a peer runs one stage of one pipeline in the simulator.
A coordinator's plan decomposes back into its own pipelines (each stage starts where the
previous one ends); overlapping spans (Petals' rule) are used in part. Two simplifications, the
same for every policy: a peer serving part of its range is charged only that part's weights,
so its KV room is the one of the part; and a live Petals client may route many chains through
one strong peer, which disjoint chains cannot (this undercounts Petals' rule where one peer
is much stronger than its neighbours).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import StageLayout


@dataclass(frozen=True)
class PeerSpan:
    """A peer (machine) serving layers [start, end) with these devices as one TP group."""

    machine: str
    device_ids: tuple[str, ...]
    start: int
    end: int

    @property
    def layers(self) -> int:
        return self.end - self.start


def decompose(cluster: Cluster, spans: Sequence[PeerSpan], num_layers: int) -> list[list[StageLayout]]:
    """Disjoint chains of stages (device indices of `cluster`) covering [0, num_layers)."""
    free = sorted(
        (s for s in spans if all(d in cluster._positions for d in s.device_ids)),
        key=lambda s: (s.start, -s.end, s.machine),
    )
    region = {s.machine: cluster.devices[cluster.index(s.device_ids[0])].region for s in free}
    chains = []
    while True:
        starts = [s for s in free if s.start == 0]
        if not starts:
            return chains
        chain = [max(starts, key=lambda s: (s.end, s.machine))]
        used = {chain[0].machine}
        position = chain[0].end
        while position < num_layers:
            here = [s for s in free if s.machine not in used and s.start <= position < s.end]
            if not here:
                return chains
            home = region[chain[0].machine]
            nxt = max(here, key=lambda s: (region[s.machine] == home, s.start == position, s.end, s.machine))
            chain.append(nxt)
            used.add(nxt.machine)
            position = nxt.end
        chains.append(_stages(cluster, chain))
        free = [s for s in free if s.machine not in used]


def _stages(cluster: Cluster, chain: list[PeerSpan]) -> list[StageLayout]:
    stages, position = [], 0
    for span in chain:
        devices = tuple(cluster.index(d) for d in span.device_ids)
        stages.append(StageLayout(devices, position, span.end))
        position = span.end
    return stages
