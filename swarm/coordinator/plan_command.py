"""`hexswarm plan`: plan a swarm over a cluster file with the HexGen scheduler (routing/scheduler/).

Reads the cluster file (format in routing/scheduler/cluster.py and docs/scheduling.md
"Planning a cluster offline"), searches for the plan with the best SLO attainment on the given
workload (or, with `--objective throughput`, the most tokens/s with no deadline) under the
chosen serving model (pipelined and batched by default, `--serving sequential` for one request
per pipeline at a time), shows its progress on stderr (a bar on a terminal, else log lines) and
the plan on stdout: a table by default, the plan's JSON with --json. Both give the plan's
saturated capacity as a share of the cluster's upper bound. `--evaluate PLAN.json` scores a
plan the user wrote instead of searching, the same way and in the same shape. `--quant FORMAT`
plans (or scores) the cluster as if every device stored its weights in that format (the memory
model of routing/scheduler/cost_model.py); without it each device keeps the cluster file's
"quant", "none" where it has none. The plan names each stage's format. `--disaggregated` plans
with HexGen-2's scheduler instead (routing/disaggregation/): prefill and decode replicas, their
parallel plans, the max flow through them and the KV routes it takes, for the most tokens/s.
`--hepti GROUP.json` prints Hepti's uneven tensor-parallel split of one peer's ranks instead
(routing/hepti/; the group file's format is in docs/scheduling.md, "Hepti"): no cluster, no search.
"""

from __future__ import annotations

import argparse
import json
import logging
import os

from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT, QUANT_FORMATS
from hexswarm.swarm.commands import cli_args
from hexswarm.swarm.coordinator.model_args import add_workload_arguments, load_model, read_json_object
from hexswarm.swarm.tools import log_setup

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:

    # required unless --hepti is given (checked in run)
    parser.add_argument("--cluster", help="cluster JSON file (devices and network); required without --hepti")
    parser.add_argument(
        "--model",
        help=f"{cli_args.MODEL_HELP}, or a preset of the HexGen paper's models (Llama-2-70B, Llama-2-7B, OPT-30B); "
        "required without --hepti, where it overrides the group file's model",
    )
    add_workload_arguments(parser)
    parser.add_argument(
        "--quant",
        choices=QUANT_FORMATS,
        default=None,
        help='plan as if every device stored its weights in this format (default: each device\'s "quant" '
        'in the cluster file, "none" where it has none)',
    )
    parser.add_argument(
        "--slo-scale",
        type=cli_args.positive_float,
        default=5.0,
        help="deadline in units of the model's latency on one 8 x A100 machine",
    )
    parser.add_argument(
        "--budget-s", type=cli_args.positive_float, default=20.0, help="search time budget in seconds"
    )
    parser.add_argument(
        "--serving",
        choices=("pipelined-batched", "sequential"),
        default="pipelined-batched",
        help="serving model to plan for (sequential: one request per pipeline at a time)",
    )
    parser.add_argument(
        "--max-batch-sequences",
        type=cli_args.positive_int,
        default=16,
        help="most sequences a stage batches in one decode step, as run-peer's flag of that name "
        "(1: pipelining alone); was --max-batch",
    )
    cli_args.hidden_alias(parser, "--max-batch", "--max-batch-sequences", cli_args.positive_int)
    parser.add_argument(
        "--seed",
        type=cli_args.non_negative_int,
        default=0,
        help="seed of the search and of the simulated trace",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--disaggregated",
        action="store_true",
        help="plan prefill and decode replicas apart (HexGen-2): groups, roles, parallel plans, "
        "max-flow values, KV routes and the estimated tokens/s",
    )
    parser.add_argument(
        "--hepti",
        metavar="GROUP.json",
        default=None,
        help="print Hepti's split of one layer range over a peer's uneven ranks (heads and MLP columns "
        "per rank, the mode, the predicted step) for the devices this file describes",
    )
    parser.add_argument(
        "--evaluate",
        metavar="PLAN.json",
        default=None,
        help="score this plan instead of searching: a plan printed by --json, or pipelines written by hand "
        '({"pipelines": [{"stages": [{"device_ids": [...], "start": 0, "end": 40}, ...]}, ...]}); '
        "the same estimate and bound ratio, in the same shape",
    )


def run(args: argparse.Namespace) -> int:
    from hexswarm.routing.scheduler.cluster import ClusterError
    from hexswarm.routing.scheduler.search.search_result import NoFeasiblePlanError

    try:
        return _run(args)
    except (ClusterError, NoFeasiblePlanError, ValueError, OSError) as exc:
        return cli_args.usage_error("hexswarm plan", str(exc))


def _run(args: argparse.Namespace) -> int:
    from hexswarm.routing.scheduler.model_spec import Workload

    if args.hepti:
        split = hepti_split(args.hepti, args.model)
        print(json.dumps(split.to_dict(), indent=2) if args.json else format_hepti(split))
        return 0
    missing = [flag for flag, value in (("--cluster", args.cluster), ("--model", args.model)) if not value]
    if missing:
        raise ValueError(f"the following arguments are required: {', '.join(missing)}")
    cluster = load_cluster(args.cluster)
    if args.quant is not None:
        cluster = cluster.with_quant(args.quant)
    model = load_model(args.model)
    workload = Workload(
        rate=args.rate,
        s_in=args.s_in,
        s_out=args.s_out,
        slo_scale=args.slo_scale,
        seed=args.seed,
        serving=args.serving,
        max_batch=args.max_batch_sequences,
        objective=args.objective,
    )
    if args.evaluate and _is_disaggregated(args.evaluate):
        plan = evaluate_disaggregated_file(args.evaluate, cluster, model, workload)
        print(plan.to_json(indent=2) if args.json else format_disaggregated(plan))
        return 0
    if args.disaggregated:
        if args.evaluate:
            raise ValueError(
                f"{args.evaluate} is a colocated plan; --disaggregated scores a disaggregated one"
            )
        plan = _disaggregated(args, cluster, model, workload)
        print(plan.to_json(indent=2) if args.json else format_disaggregated(plan))
        return 0
    if args.evaluate:
        plan = evaluate(args.evaluate, cluster, model, workload)
    else:
        plan = _search(args, cluster, model, workload)
    print(plan.to_json(indent=2) if args.json else format_plan(plan))
    return 0


def _search(args: argparse.Namespace, cluster, model, workload):
    """The best plan the search finds in --budget-s, its progress on stderr."""
    from hexswarm.routing.scheduler.search.genetic import SearchConfig
    from hexswarm.routing.scheduler.search.search import search
    from hexswarm.routing.scheduler.search.search_result import Progress

    logger.info(
        "planning %s on %d devices for %s (budget %g s, serving %s, max batch %d)",
        model.name, len(cluster), args.objective, args.budget_s, args.serving, args.max_batch_sequences,
    )  # fmt: skip
    measure = "attainment" if workload.has_deadline else "req/s"
    config = SearchConfig(time_budget_s=args.budget_s, seed=args.seed, stall_generations=100)
    with log_setup.progress(total=100, desc="planning", unit="%") as bar:  # share of the time budget

        def report(p: Progress) -> None:
            """Per generation: a bar over the time budget on a terminal, else a log line every 10."""
            best = f"{p.best_attainment:.1%}" if workload.has_deadline else f"{p.best_attainment:.2f}"
            bar.set_postfix_str(f"generation {p.generation}, {measure} {best}", refresh=False)
            bar.update(min(100, int(100 * p.elapsed_s / args.budget_s)) - bar.n)
            if not log_setup.progress_enabled() and p.generation % 10 == 0:
                logger.info(
                    "generation %4d  %s %s  mean latency %7.2f s  (%.1f s)",
                    p.generation, measure, best, p.best_mean_latency_s, p.elapsed_s,
                )  # fmt: skip

        result = search(cluster, model, workload, config, progress=report)
    # Said here too, not only every 10 generations: a loaded machine may run none in the budget.
    best = max((fitness[0] for fitness, _ in result.finalists), default=None)
    shown = (
        ""
        if best is None
        else f", best {measure} " + (f"{best:.1%}" if workload.has_deadline else f"{best:.2f}")
    )
    logger.info("done: %d generations, %.1f s%s", result.generations, result.elapsed_s, shown)
    return result.plan


def _disaggregated(args: argparse.Namespace, cluster, model, workload):
    """HexGen-2's plan of the cluster in --budget-s (it maximizes tokens/s: no deadline)."""
    from hexswarm.routing.disaggregation.planner import DisaggregationConfig, plan_disaggregated

    logger.info(
        "planning %s on %d devices, prefill and decode apart (budget %g s)",
        model.name,
        len(cluster),
        args.budget_s,
    )
    result = plan_disaggregated(cluster, model, workload, DisaggregationConfig(args.budget_s, args.seed))
    logger.info(
        "done: %d values of K, %d placements, %d swaps kept, %.1f s",
        result.starts, result.evaluations, result.swaps_kept, result.search_s,
    )  # fmt: skip
    return result.plan


def format_disaggregated(plan) -> str:
    """A readable table: each replica with its role, stages, capacity and flow, then the KV routes."""
    prefill, decode = plan.indices("prefill"), plan.indices("decode")
    lines = [
        f"disaggregated plan for {plan.model}: {len(prefill)} prefill and {len(decode)} decode replicas "
        f"on {sum(len(r.device_ids) for r in plan.replicas)} devices"
    ]
    for i, replica in enumerate(plan.replicas):
        batch = f", decodes up to {replica.max_sequences} at once" if replica.role == "decode" else ""
        lines.append(
            f"replica {i}  {replica.role:7}  strategy {replica.strategy}  capacity {replica.capacity_rps:.2f} req/s"
            f"  flow {replica.flow_rps:.2f} req/s{batch}"
        )
        for stage in replica.stages:
            span = f"[{stage.start}, {stage.end})"
            lines.append(f"    layers {span:>10}  tp={stage.tp_degree}  {', '.join(stage.device_ids)}")
    dispatch = plan.dispatch()
    lines.append("KV routes (flow / capacity in req/s, share of the prefill replica's requests):")
    for route in plan.routes:
        if route.flow_rps > 0:
            share = dispatch[route.prefill].get(route.decode, 0.0)
            lines.append(
                f"    replica {route.prefill} -> replica {route.decode}  "
                f"{route.flow_rps:.2f} / {route.capacity_rps:.2f}  {share:.0%}"
            )
    lines.append(
        f"estimate: {plan.flow_rps:.2f} req/s through the max flow = {plan.throughput_tok_s:.0f} tokens/s "
        f"(s_in {plan.s_in}, s_out {plan.s_out}, max batch {plan.max_batch})"
    )
    return "\n".join(lines)


def hepti_split(path: str, model: str | None):
    """Hepti's split of the group that `path` describes (docs/scheduling.md, "Hepti"); `model`
    (a built-in name, a GGUF file or a checkpoint folder) overrides the file's "model". Errors are
    ValueError (HeptiInfeasibleError when no split fits) or OSError, with the path in them."""
    from hexswarm.routing.hepti.problem import LayerShape
    from hexswarm.routing.hepti.split import plan_split, problem_from_dict
    from hexswarm.swarm.models.model_spec import resolve_checkpoint

    raw = read_json_object(path)
    layers = raw.get("layers")
    if isinstance(raw.get("shape"), dict) and model is None:
        try:
            shape = LayerShape(**{**raw["shape"], **({"num_layers": layers} if layers else {})})
        except TypeError as exc:
            raise ValueError(f"{path}: shape: {exc}") from exc
    elif model or raw.get("model"):
        name = model or str(raw["model"])
        beside = os.path.join(os.path.dirname(os.path.abspath(path)), name)
        folder = resolve_checkpoint(name if model or not os.path.exists(beside) else beside)
        config = read_json_object(str(folder / "config.json"))
        shape = LayerShape.from_hf_config(config, layers)
    else:
        raise ValueError(f'{path} names no "model" or "shape" (or pass --model)')
    return plan_split(problem_from_dict(raw, shape))


def format_hepti(split) -> str:
    """A readable table: one line per rank (heads, MLP columns, weights against free memory,
    compute per step), then the predicted step against the even split."""
    lines = [
        f"Hepti split over {len(split.shares)} devices: {split.layers} layers, {split.tokens} tokens per step, "
        f"mode {split.mode} ({split.solver}, MLP tile {split.tile} columns)",
        f"{'device':16} {'heads':>5} {'MLP columns':>11} {'weights MiB':>11} {'free MiB':>10} {'compute ms':>10}",
    ]
    for s in split.shares:
        lines.append(
            f"{s.device:16} {s.heads:5d} {s.mlp_columns:11d} {s.weight_bytes / 2**20:11.1f} "
            f"{s.free_bytes / 2**20:10.1f} {s.compute_s * 1e3:10.3f}"
        )
    even = split.even_step_time_s
    versus = (
        "no even split divides the units and fits"
        if even == float("inf")
        else f"the even split: {even * 1e3:.3f} ms"
    )
    lines.append(
        f"predicted step {split.step_time_s * 1e3:.3f} ms (attention {split.attention_s * 1e3:.3f} ms, "
        f"MLP {split.mlp_s * 1e3:.3f} ms, communication included); {versus}"
    )
    return "\n".join(lines)


def evaluate(path: str, cluster, model, workload):
    """The plan in `path` scored as the search scores its own (same trace, serving model,
    capacity and bound), so a layout written by hand compares with a searched one. ValueError
    (PlanError) for a plan that does not fit the model or the cluster."""
    from hexswarm.routing.scheduler.bounds.capacity import saturating_workload
    from hexswarm.routing.scheduler.plan import SCHEMA_VERSION, Plan, PlanError
    from hexswarm.routing.scheduler.plan_eval import make_plan, memory_violations, plan_layouts
    from hexswarm.routing.scheduler.simulation.serving import evaluate_layouts
    from hexswarm.routing.scheduler.simulation.simulator import make_trace

    raw = _read_plan_json(path)
    if isinstance(raw, dict):  # what a hand-written plan may leave out
        raw = {"schema_version": SCHEMA_VERSION, "model": model.name, "num_layers": model.num_layers, **raw}
    plan = Plan.from_dict(raw)
    if plan.num_layers != model.num_layers:
        raise PlanError(f"{path} covers {plan.num_layers} layers; {model.name} has {model.num_layers}")
    known = {d.id for d in cluster.devices}
    unknown = sorted(set(plan.device_ids) - known)
    if unknown:
        raise PlanError(f"{path} names devices that are not in the cluster: {', '.join(unknown)}")
    too_small = memory_violations(cluster, model, workload, plan)
    if too_small:
        raise PlanError(f"{path} does not fit in memory: {'; '.join(too_small)}")
    if workload.objective == "throughput":  # as the search: offer more than the plan serves
        workload = saturating_workload(cluster, model, workload)
    layouts = plan_layouts(cluster, model, workload, plan)
    trace = make_trace(model, workload)
    result = evaluate_layouts(cluster, layouts, model, trace, workload)
    return make_plan(cluster, model, workload, layouts, result, trace.deadline_s)


def _read_plan_json(path: str):
    from hexswarm.routing.scheduler.plan import PlanError

    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as exc:
            raise PlanError(f"{path} is not valid JSON: {exc}") from exc


def _is_disaggregated(path: str) -> bool:
    """Whether the plan in `path` is one `--disaggregated --json` printed (it has replicas)."""
    raw = _read_plan_json(path)
    return isinstance(raw, dict) and "replicas" in raw


def evaluate_disaggregated_file(path: str, cluster, model, workload):
    """A disaggregated plan printed by --json, its placement scored again on this cluster."""
    from hexswarm.routing.disaggregation.plan_record import DisaggregatedPlan
    from hexswarm.routing.disaggregation.planner import evaluate_disaggregated

    plan = DisaggregatedPlan.from_dict(_read_plan_json(path))
    if plan.num_layers != model.num_layers:
        raise ValueError(f"{path} covers {plan.num_layers} layers; {model.name} has {model.num_layers}")
    return evaluate_disaggregated(cluster, model, workload, plan)


def load_cluster(path: str):
    """Reads and parses a cluster file; errors are ClusterError / OSError with the path in them."""
    from hexswarm.routing.scheduler.cluster import Cluster, ClusterError

    with open(path, encoding="utf-8") as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as exc:
            raise ClusterError(f"{path} is not valid JSON: {exc}") from exc
    return Cluster.from_dict(raw)


def seconds(x: float) -> str:
    """Seconds with three significant digits: a small model's plan takes milliseconds, a large
    one's minutes, and "0.00 s" says nothing."""
    return f"{x:.3g} s"


def format_plan(plan) -> str:
    """A readable table: one line per stage, grouped by pipeline."""
    lines = [f"plan for {plan.model}: {len(plan.pipelines)} pipelines on {len(plan.device_ids)} devices"]
    for i, pipeline in enumerate(plan.pipelines):
        lines.append(f"pipeline {i}  strategy {pipeline.strategy}  latency {seconds(pipeline.latency_s)}")
        for stage in pipeline.stages:
            span = f"[{stage.start}, {stage.end})"
            quant = "" if stage.quant == DEFAULT_QUANT else f"  {stage.quant}"
            lines.append(f"    layers {span:>10}  tp={stage.tp_degree}{quant}  {', '.join(stage.device_ids)}")
    est = plan.estimate
    if est is not None and est.objective == "throughput":
        lines.append(
            f"estimate ({est.serving}, max batch {est.max_batch}, no deadline): offered {est.rate:.3g} req/s, "
            f"more than any placement serves; mean latency {seconds(est.mean_latency_s)}, "
            f"p99 {seconds(est.p99_latency_s)} under that load, s_in {est.s_in}, s_out {est.s_out}"
        )
    elif est is not None:
        lines.append(
            f"estimate ({est.serving}, max batch {est.max_batch}): {est.attainment:.1%} of requests within "
            f"the {seconds(est.slo_s)} SLO at {est.rate:g} req/s (goodput {est.goodput_rps:.3g} req/s, "
            f"mean latency {seconds(est.mean_latency_s)}, p99 {seconds(est.p99_latency_s)}, s_in {est.s_in}, "
            f"s_out {est.s_out})"
        )
    if est is not None:
        lines.append(f"throughput {est.throughput_tok_s:.0f} tokens/s at {est.rate:.4g} req/s")
        if est.capacity_tok_s > 0:
            within = f"; {est.slo_capacity_tok_s:.0f} tokens/s within the SLO ({est.slo_bound_ratio:.1%})"
            lines.append(
                f"capacity {est.capacity_tok_s:.0f} tokens/s saturated = {est.bound_ratio:.1%} of the upper bound "
                f"({est.upper_bound_tok_s:.0f} tokens/s for any placement of this cluster)"
                + (within if est.objective == "slo" else "")
            )
    return "\n".join(lines)
