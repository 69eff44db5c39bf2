"""KV-cache transfer between a prefill and a decode replica (HexGen-2 §3.3, Table 1, Appendix A).

Table 1 charges a KV transfer over a link alpha_dd' + 2 b s_in H B / beta_dd' (the key and the
value of every prompt token, for the layers the link carries). §3.3: each GPU that holds layer
j in the prefill replica sends that layer's cache to the GPU that holds layer j in the decode
replica, and the edge's capacity is the collective performance of all these GPU-to-GPU
transfers. So for every pair of a prefill stage and a decode stage whose layer ranges overlap,
the overlap's cache travels over min(t_p, t_q) GPU pairs in parallel (rank i of the smaller TP
group to rank i of the other, each carrying its share of the heads), and a request's transfer
takes as long as the slowest of all these channels. Layer counts and KV width come from
`ModelSpec` (exact for grouped-query attention, where a token's cache is much smaller than 2H).

Not modelled: reordering pipeline stages to shorten the transfer (Appendix A does that), and
several transfers sharing one GPU's link (each channel is taken as the pair's own bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineLayout


@dataclass(frozen=True, eq=False)
class KvLink:
    """The channels one request's KV cache travels over, from a prefill to a decode replica."""

    latency_s: np.ndarray  # (C,) alpha of each channel
    seconds_per_token: np.ndarray  # (C,) seconds each prompt token's share takes on it

    def seconds(self, s_in: float) -> float:
        """Time to move the cache of a prompt of `s_in` tokens: the slowest channel."""
        return float(np.max(self.latency_s + self.seconds_per_token * s_in))

    def capacity_rps(self, s_in: float) -> float:
        """Requests per second the link carries, one transfer after the other."""
        return 1.0 / self.seconds(s_in)


def kv_bytes_per_token(model: ModelSpec, layers: int) -> float:
    """Key and value of one token over `layers` layers (Table 1's 2 s_in H B, per token)."""
    return 2.0 * model.kv_width * model.dtype_bytes * layers


def kv_link(cluster: Cluster, model: ModelSpec, prefill: PipelineLayout, decode: PipelineLayout) -> KvLink:
    """The channels between two replicas' layouts (module docstring)."""
    latency, per_token = [], []
    for p in prefill.stages:
        for q in decode.stages:
            overlap = min(p.end, q.end) - max(p.start, q.start)
            if overlap <= 0:
                continue
            ranks = min(len(p.devices), len(q.devices))
            share = kv_bytes_per_token(model, overlap) / ranks
            for i in range(ranks):
                a, b = p.devices[i], q.devices[i]
                latency.append(float(cluster.latency[a, b]))
                per_token.append(share / float(cluster.bandwidth[a, b]))
    return KvLink(np.array(latency), np.array(per_token))
