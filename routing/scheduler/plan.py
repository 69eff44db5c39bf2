"""The Plan record: which devices serve which layers, as plain data (HexGen §4.1's assignment sigma).

A plan is a list of independent pipelines (model replicas); each pipeline is a list of stages;
each stage is a TP group (device ids, degree = number of devices) serving layers [start, end),
with the weight format its devices store the layers in (`weight_formats.py`; "none" in plans
written before formats, which read back so).
It carries the estimate it was chosen with. `to_dict()` gives only str / int / float / list /
dict values, so the same dict goes through JSON here and through msgpack in `swarm/`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from hexswarm.routing.scheduler.model_spec import OBJECTIVES
from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT, UnknownQuantError, check_quant

SCHEMA_VERSION = 1


class PlanError(ValueError):
    """A plan dict that does not describe a valid plan."""


@dataclass(frozen=True)
class StagePlan:
    """One TP group: `device_ids` (leader first) serving layers [start, end) in format `quant`."""

    device_ids: tuple[str, ...]
    start: int
    end: int
    quant: str = DEFAULT_QUANT

    @property
    def tp_degree(self) -> int:
        return len(self.device_ids)

    @property
    def layers(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class PipelinePlan:
    """One model replica: stages in order, with its estimated latency for a mean request."""

    stages: tuple[StagePlan, ...]
    latency_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def device_ids(self) -> tuple[str, ...]:
        return tuple(d for stage in self.stages for d in stage.device_ids)

    @property
    def strategy(self) -> list[int]:
        """TP degree of each stage, the notation of HexGen Table 4 (e.g. [2, 1, 1, 2])."""
        return [s.tp_degree for s in self.stages]


@dataclass(frozen=True)
class PlanEstimate:
    """What the simulator predicted for the plan on the workload it was planned for."""

    attainment: float  # share of requests within the SLO
    goodput_rps: float  # requests per second within the SLO
    mean_latency_s: float  # of the requests within the SLO
    slo_s: float  # the deadline
    rate: float  # requests per second offered
    s_in: int
    s_out: int
    # Added with the pipelined, batched serving model; plans written before read back with these.
    serving: str = "sequential"  # the serving model the figures are for
    max_batch: int = 1  # decode steps a stage batches
    p99_latency_s: float = 0.0  # of the requests served
    throughput_tok_s: float = 0.0  # generated tokens per second at the offered `rate`
    upper_bound_tok_s: float = 0.0  # most tokens/s any placement could serve (0: not computed)
    # Tokens/s under a saturating offered rate (`capacity.py`); 0 when not measured.
    capacity_tok_s: float = 0.0  # every request admitted, no deadline
    slo_capacity_tok_s: float = 0.0  # the SLO dispatcher turns requests away
    objective: str = "slo"  # what the search maximized (`model_spec.OBJECTIVES`); "throughput": slo_s is inf

    @property
    def bound_ratio(self) -> float:
        """Capacity as a share of the upper bound: neither has a deadline (0 when not measured).

        Not throughput / bound: at an offered rate below the plan's capacity the throughput is
        the offered rate, whatever the plan."""
        return self.capacity_tok_s / self.upper_bound_tok_s if self.upper_bound_tok_s > 0 else 0.0

    @property
    def slo_bound_ratio(self) -> float:
        """SLO capacity as a share of the upper bound (what the deadline leaves of it)."""
        return self.slo_capacity_tok_s / self.upper_bound_tok_s if self.upper_bound_tok_s > 0 else 0.0


@dataclass(frozen=True)
class Plan:
    """A complete assignment of a model onto a cluster."""

    model: str
    num_layers: int
    pipelines: tuple[PipelinePlan, ...]
    estimate: PlanEstimate | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def device_ids(self) -> tuple[str, ...]:
        return tuple(d for p in self.pipelines for d in p.device_ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "model": self.model,
            "num_layers": self.num_layers,
            "pipelines": [
                {
                    "latency_s": p.latency_s,
                    "prefill_s": p.prefill_s,
                    "decode_s": p.decode_s,
                    "stages": [
                        {
                            "device_ids": list(s.device_ids),
                            "tp_degree": s.tp_degree,
                            "start": s.start,
                            "end": s.end,
                            "quant": s.quant,
                        }
                        for s in p.stages
                    ],
                }
                for p in self.pipelines
            ],
            "estimate": None
            if self.estimate is None
            else {
                **vars(self.estimate),
                "slo_s": None if math.isinf(self.estimate.slo_s) else self.estimate.slo_s,  # JSON has no inf
                "bound_ratio": self.estimate.bound_ratio,
                "slo_bound_ratio": self.estimate.slo_bound_ratio,
            },
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Plan:
        """Validates and reads a dict made by `to_dict` (from JSON or msgpack)."""
        if not isinstance(raw, dict):
            raise PlanError("a plan must be a dict")
        version = raw.get("schema_version")
        if version != SCHEMA_VERSION:
            raise PlanError(f"plan schema_version {version!r} is not {SCHEMA_VERSION}")
        num_layers = _int(raw, "num_layers")
        pipelines = raw.get("pipelines")
        if not isinstance(pipelines, list):
            raise PlanError("plan.pipelines must be a list")
        plan = cls(
            str(raw.get("model", "")),
            num_layers,
            tuple(_pipeline(p) for p in pipelines),
            _estimate(raw.get("estimate")),
            version,
        )
        validate(plan)
        return plan

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"plan is not valid JSON: {exc}") from exc
        return cls.from_dict(raw)


def validate(plan: Plan) -> None:
    """Checks that each pipeline covers [0, num_layers) in order and no device is used twice."""
    seen: set[str] = set()
    for i, pipeline in enumerate(plan.pipelines):
        position = 0
        for stage in pipeline.stages:
            if stage.start != position or stage.end <= stage.start or not stage.device_ids:
                raise PlanError(f"pipeline {i}: stages must cover consecutive non-empty layer ranges")
            position = stage.end
            for device in stage.device_ids:
                if device in seen:
                    raise PlanError(f"device {device!r} appears twice in the plan")
                seen.add(device)
        if position != plan.num_layers:
            raise PlanError(f"pipeline {i} covers layers [0, {position}), not [0, {plan.num_layers})")


def _int(raw: dict, key: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{key} must be an integer, got {value!r}")
    return value


def _float(raw: dict, key: str) -> float:
    value = raw.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"{key} must be a number, got {value!r}")
    return float(value)


def _pipeline(raw: Any) -> PipelinePlan:
    if not isinstance(raw, dict) or not isinstance(raw.get("stages"), list):
        raise PlanError("each pipeline must be a dict with a stages list")
    stages = []
    for s in raw["stages"]:
        if not isinstance(s, dict) or not isinstance(s.get("device_ids"), list):
            raise PlanError("each stage must be a dict with a device_ids list")
        ids = tuple(str(d) for d in s["device_ids"])
        if "tp_degree" in s and s["tp_degree"] != len(ids):
            raise PlanError(f"stage tp_degree {s['tp_degree']!r} does not match {len(ids)} devices")
        try:
            quant = check_quant(s.get("quant", DEFAULT_QUANT))
        except UnknownQuantError as exc:
            raise PlanError(f"stage quant: {exc}") from None
        stages.append(StagePlan(ids, _int(s, "start"), _int(s, "end"), quant))
    return PipelinePlan(
        tuple(stages), _float(raw, "latency_s"), _float(raw, "prefill_s"), _float(raw, "decode_s")
    )


def _estimate(raw: Any) -> PlanEstimate | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise PlanError("plan.estimate must be a dict or null")
    serving = raw.get("serving", "sequential")
    if not isinstance(serving, str):
        raise PlanError(f"estimate.serving must be a string, got {serving!r}")
    objective = raw.get("objective", "slo")
    if objective not in OBJECTIVES:
        raise PlanError(f"estimate.objective must be one of {OBJECTIVES}, got {objective!r}")
    return PlanEstimate(
        _float(raw, "attainment"),
        _float(raw, "goodput_rps"),
        _float(raw, "mean_latency_s"),
        math.inf if raw.get("slo_s", 0.0) is None else _float(raw, "slo_s"),
        _float(raw, "rate"),
        _int(raw, "s_in"),
        _int(raw, "s_out"),
        serving,
        _int(raw, "max_batch") if "max_batch" in raw else 1,
        _float(raw, "p99_latency_s"),
        _float(raw, "throughput_tok_s"),
        _float(raw, "upper_bound_tok_s"),
        _float(raw, "capacity_tok_s"),
        _float(raw, "slo_capacity_tok_s"),
        objective,
    )
