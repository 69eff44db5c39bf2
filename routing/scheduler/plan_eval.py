"""Plans and layouts, both ways: `make_plan` turns a search's layouts into a Plan with its
estimate (capacity and bound included), and the rest checks and scores a given Plan (a fixed
one such as HexGen's Table 4, or one read back from disk) and computes the upper bound its
throughput is compared with. Every placement search ends in `make_plan`."""

from __future__ import annotations

from collections.abc import Sequence

from hexswarm.routing.scheduler.bounds.capacity import plan_capacity
from hexswarm.routing.scheduler.bounds.upper_bound import throughput_upper_bound
from hexswarm.routing.scheduler.cluster import Cluster
from hexswarm.routing.scheduler.cost_model import stage_layer_bytes, stage_memory, stage_quant
from hexswarm.routing.scheduler.model_spec import ModelSpec, Workload
from hexswarm.routing.scheduler.pipeline_layout.pipeline_dp import PipelineDP, PipelineLayout, StageLayout
from hexswarm.routing.scheduler.plan import PipelinePlan, Plan, PlanEstimate, StagePlan
from hexswarm.routing.scheduler.simulation.fitness import Estimate, estimate_layouts
from hexswarm.routing.scheduler.simulation.serving import evaluate_layouts
from hexswarm.routing.scheduler.simulation.simulator import SimResult, make_trace


def plan_layouts(cluster: Cluster, model: ModelSpec, workload: Workload, plan: Plan) -> list[PipelineLayout]:
    """The plan's pipelines as layouts over `cluster` (device ids -> indices), with Eq. 2 costs."""
    dp = PipelineDP(cluster, model, workload)
    layouts = []
    for pipeline in plan.pipelines:
        stages = [
            StageLayout(tuple(cluster.index(d) for d in s.device_ids), s.start, s.end)
            for s in pipeline.stages
        ]
        layouts.append(dp.evaluate(stages))
    return layouts


def memory_violations(cluster: Cluster, model: ModelSpec, workload: Workload, plan: Plan) -> list[str]:
    """Devices whose share (Eq. 7, longest prompt of the workload) exceeds their memory."""
    tokens = workload.s_in_max + workload.s_out
    problems = []
    for pipeline in plan.pipelines:
        for stage in pipeline.stages:
            devs = [cluster.index(d) for d in stage.device_ids]
            weights = stage_layer_bytes(cluster, devs, model)
            need = stage_memory(model, stage.tp_degree, stage.layers, tokens, workload.batch_size, weights)
            for device_id in stage.device_ids:
                have = cluster.devices[cluster.index(device_id)].memory_bytes
                if need > have:
                    problems.append(
                        f"{device_id}: needs {need / 2**30:.2f} GiB for layers "
                        f"[{stage.start}, {stage.end}), has {have / 2**30:.2f} GiB"
                    )
    return problems


def upper_bound_tok_s(cluster: Cluster, model: ModelSpec, workload: Workload, result: SimResult) -> float:
    """Most generated tokens/s any placement of the cluster could serve under the workload's
    serving model (`upper_bound.py`; sequential serving batches nothing, so max_batch = 1).

    Prefill is charged the mean prompt of the requests the simulation served (`result`): the
    bound that holds for that simulation's throughput (upper_bound.py, relaxation 6)."""
    max_batch = 1 if workload.serving == "sequential" else workload.max_batch
    prompt = result.served_prompt_tokens if result.served else None
    return throughput_upper_bound(cluster, model, workload, max_batch=max_batch, prompt_tokens=prompt).tok_s


def evaluate_plan(cluster: Cluster, model: ModelSpec, workload: Workload, plan: Plan) -> SimResult:
    """A fixed plan on the workload's trace (same trace as the search) under its serving model."""
    layouts = plan_layouts(cluster, model, workload, plan)
    return evaluate_layouts(cluster, layouts, model, make_trace(model, workload), workload)


def estimate_plan(cluster: Cluster, model: ModelSpec, workload: Workload, plan: Plan) -> Estimate:
    """The search's analytic fitness (`fitness.py`) of a fixed plan, to compare with `evaluate_plan`."""
    deadline = make_trace(model, workload).deadline_s
    layouts = plan_layouts(cluster, model, workload, plan)
    return estimate_layouts(cluster, layouts, model, workload, deadline)


def pipeline_plan(cluster: Cluster, model: ModelSpec, layout: PipelineLayout) -> PipelinePlan:
    """A layout (device indices) as a PipelinePlan (device ids, each stage's weight format)."""
    stages = tuple(
        StagePlan(
            tuple(cluster.devices[d].id for d in s.devices),
            s.start,
            s.end,
            stage_quant(cluster, s.devices, model),
        )
        for s in layout.stages
    )
    return PipelinePlan(stages, layout.latency_s, layout.prefill_s, layout.decode_s)


def make_plan(
    cluster: Cluster,
    model: ModelSpec,
    workload: Workload,
    layouts: Sequence[PipelineLayout],
    result: SimResult,
    slo_s: float,
    capacity: bool = True,
) -> Plan:
    """Turns layouts (device indices) into a Plan (device ids) with its estimate; with `capacity`,
    also its capacity and bound ratio (`capacity.py`: two more event simulations)."""
    pipelines = [
        pipeline_plan(cluster, model, layout) for layout in sorted(layouts, key=lambda lay: lay.latency_s)
    ]
    finite = result.served > 0
    measured = plan_capacity(cluster, layouts, model, workload) if capacity else None
    bound = (
        upper_bound_tok_s(cluster, model, workload, result)
        if measured is None
        else measured.upper_bound_tok_s
    )
    estimate = PlanEstimate(
        result.attainment,
        result.goodput_rps,
        result.mean_latency_s if finite else 0.0,
        slo_s,
        workload.rate,
        workload.s_in,
        workload.s_out,
        workload.serving,
        1 if workload.serving == "sequential" else workload.max_batch,
        result.p99_latency_s if finite else 0.0,
        result.throughput_tok_s,
        bound,
        0.0 if measured is None else measured.capacity_tok_s,
        0.0 if measured is None else measured.slo_capacity_tok_s,
        workload.objective,
    )
    return Plan(model.name, model.num_layers, tuple(pipelines), estimate)
