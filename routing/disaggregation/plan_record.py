"""The disaggregated plan as plain data: what the coordinator publishes and peers follow.

Each replica is a prefill or a decode model replica, a pipeline of TP groups over device ids
(the `PipelinePlan` of `routing.scheduler.plan`), with its capacity and the flow the max flow
sends through it. `dispatch` says where each prefill replica sends its requests' KV caches:
decode replica -> share of its requests (the normalized flows of §3.3; each row sums to 1).
`prefill_share` is how the coordinator spreads new requests over the prefill replicas (their
flows, normalized). `to_dict()` gives only str / int / float / list / dict values (JSON here,
msgpack in `swarm/`), with a schema version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hexswarm.routing.disaggregation.placement import Placement
from hexswarm.routing.disaggregation.roles import DECODE, PREFILL, ROLES
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.plan import PipelinePlan, PlanError, StagePlan
from hexswarm.routing.scheduler.plan_eval import pipeline_plan

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ReplicaPlan:
    """One prefill or decode replica: its pipeline, what it can serve and what it is sent."""

    role: str
    pipeline: PipelinePlan  # stages in order, with Eq. 2's latency at the mean prompt
    capacity_rps: float
    flow_rps: float
    max_sequences: int = 0  # decode: most sequences it decodes at once (its batch scheduler's cap)

    @property
    def stages(self) -> tuple[StagePlan, ...]:
        return self.pipeline.stages

    @property
    def device_ids(self) -> tuple[str, ...]:
        return self.pipeline.device_ids

    @property
    def strategy(self) -> list[int]:
        return self.pipeline.strategy


@dataclass(frozen=True)
class KvRoute:
    """The KV link from prefill replica `prefill` to decode replica `decode` (indices into
    `DisaggregatedPlan.replicas`)."""

    prefill: int
    decode: int
    capacity_rps: float
    flow_rps: float


@dataclass(frozen=True)
class DisaggregatedPlan:
    """Replicas with roles, their KV routes and dispatch ratios, and the estimate."""

    model: str
    num_layers: int
    replicas: tuple[ReplicaPlan, ...]
    routes: tuple[KvRoute, ...]
    s_in: int
    s_out: int
    max_batch: int

    @property
    def flow_rps(self) -> float:
        return sum(r.flow_rps for r in self.replicas if r.role == PREFILL)

    @property
    def throughput_tok_s(self) -> float:
        """The estimate: requests per second through the max flow x generated tokens each."""
        return self.flow_rps * self.s_out

    def indices(self, role: str) -> list[int]:
        return [i for i, r in enumerate(self.replicas) if r.role == role]

    def dispatch(self) -> dict[int, dict[int, float]]:
        """Prefill replica -> {decode replica: share of its requests}; each row sums to 1 (a
        prefill replica the flow leaves idle shares by its routes' capacities)."""
        out = {}
        for i in self.indices(PREFILL):
            routes = [r for r in self.routes if r.prefill == i]
            weights = {r.decode: r.flow_rps for r in routes if r.flow_rps > 0}
            if not weights:
                weights = {r.decode: r.capacity_rps for r in routes if r.capacity_rps > 0}
            total = sum(weights.values())
            out[i] = {j: w / total for j, w in sorted(weights.items())} if total > 0 else {}
        return out

    def prefill_share(self) -> dict[int, float]:
        """Prefill replica -> share of new requests (its flow over the total)."""
        total = self.flow_rps
        return {i: self.replicas[i].flow_rps / total if total > 0 else 0.0 for i in self.indices(PREFILL)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "num_layers": self.num_layers,
            "s_in": self.s_in,
            "s_out": self.s_out,
            "max_batch": self.max_batch,
            "replicas": [
                {
                    "role": r.role,
                    "capacity_rps": r.capacity_rps,
                    "flow_rps": r.flow_rps,
                    "max_sequences": r.max_sequences,
                    "prefill_s": r.pipeline.prefill_s,
                    "decode_s": r.pipeline.decode_s,
                    "stages": [
                        {"device_ids": list(s.device_ids), "start": s.start, "end": s.end, "quant": s.quant}
                        for s in r.stages
                    ],
                }
                for r in self.replicas
            ],
            "routes": [
                {
                    "prefill": k.prefill,
                    "decode": k.decode,
                    "capacity_rps": k.capacity_rps,
                    "flow_rps": k.flow_rps,
                }
                for k in self.routes
            ],
            "throughput_tok_s": self.throughput_tok_s,
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, raw: Any) -> DisaggregatedPlan:
        """Reads `to_dict`'s output back; raises PlanError on anything else."""
        try:
            if raw["schema_version"] != SCHEMA_VERSION:
                raise PlanError(f"unknown disaggregated plan schema {raw['schema_version']!r}")
            replicas = tuple(
                ReplicaPlan(
                    _role(r["role"]),
                    _pipeline(r),
                    float(r["capacity_rps"]),
                    float(r["flow_rps"]),
                    int(r["max_sequences"]),
                )
                for r in raw["replicas"]
            )
            routes = tuple(
                KvRoute(int(k["prefill"]), int(k["decode"]), float(k["capacity_rps"]), float(k["flow_rps"]))
                for k in raw["routes"]
            )
            return cls(
                str(raw["model"]),
                int(raw["num_layers"]),
                replicas,
                routes,
                int(raw["s_in"]),
                int(raw["s_out"]),
                int(raw["max_batch"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"not a disaggregated plan: {exc}") from exc


def _pipeline(raw: dict) -> PipelinePlan:
    stages = tuple(
        StagePlan(tuple(map(str, s["device_ids"])), int(s["start"]), int(s["end"]), str(s["quant"]))
        for s in raw["stages"]
    )
    prefill, decode = float(raw["prefill_s"]), float(raw["decode_s"])
    return PipelinePlan(stages, prefill + decode, prefill, decode)


def _role(value: Any) -> str:
    if value not in ROLES:
        raise PlanError(f"unknown role {value!r}")
    return value


def make_disaggregated_plan(
    cluster: Cluster, model: ModelSpec, workload: Workload, placement: Placement
) -> DisaggregatedPlan:
    """The plan of an evaluated placement (replicas that cannot hold the model are left out)."""
    replicas: list[ReplicaPlan] = []
    index: dict[tuple[str, int], int] = {}
    for role, group, flows in (
        (PREFILL, placement.prefill, placement.flow.prefill_rps),
        (DECODE, placement.decode, placement.flow.decode_rps),
    ):
        for i, (replica, flow) in enumerate(zip(group, flows, strict=True)):
            if replica.layout is None:
                continue
            index[role, i] = len(replicas)
            pipeline = pipeline_plan(cluster, model, replica.layout)
            replicas.append(ReplicaPlan(role, pipeline, replica.capacity_rps, flow, replica.max_sequences))
    routes = tuple(
        KvRoute(
            index[PREFILL, i],
            index[DECODE, j],
            placement.kv_rps[i, j],
            placement.flow.kv_rps.get((i, j), 0.0),
        )
        for (i, j) in sorted(placement.kv_rps)
    )
    return DisaggregatedPlan(
        model.name,
        model.num_layers,
        tuple(replicas),
        routes,
        workload.s_in,
        workload.s_out,
        workload.max_batch,
    )
