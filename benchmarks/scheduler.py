"""How good and how fast the HexGen scheduler is on §5.1's clusters and on 1,000 GPUs.

Llama-2-70B, prompts 64-192 tokens, 32 output tokens, SLO scale 5 (HexGen §5.1; --slo-scale), Poisson
arrivals. Rates are loaded ones: `--loads` x the cluster's upper bound in requests/s
(`upper_bound.py` at max_batch 16), the same offered rate for both serving models. Each row:
  attainment, goodput_rps, throughput_tok_s, p99_latency_s   our plan, event-simulated
  capacity_tok_s, slo_capacity_tok_s   our plan's tokens/s at a saturating offered rate
                                    (1.5 x the bound), every request admitted / with the SLO
                                    dispatcher on (`capacity.py`, measured after the search)
  upper_bound_tok_s, bound_ratio    the bound for the prompts served, capacity / bound
  slo_bound_ratio                   SLO capacity / bound (what the deadline leaves)
  slo_upper_bound_tok_s             the bound within the deadline (`slo_bound.py`: TP degrees
                                    with their all-reduce floor, the met requests' latency sum)
  slo_capacity_vs_slo_bound         SLO capacity / that bound
  allreduce_share                   share of our plan's saturated work in TP all-reduce, which
                                    the bound does not charge (`capacity.allreduce_share`)
  throughput_ratio                  throughput at the row's offered rate / bound (the old
                                    `bound_ratio`: at loads < 1 it cannot reach 1 by construction)
  attainment_symmetric / goodput_symmetric   best plan whose stages share one TP degree and
                                    layer count (HexGen's baseline ii), same serving model,
                                    searched for our whole budget without an early stop
  attainment_table4 / goodput_table4   HexGen's Table 4 plan replayed (full-price cluster)
  fitness_vs_sim                    the search's analytic fitness against the event simulation
                                    on the plans of the row (finalists, baseline, Table 4):
                                    Spearman rank correlation and mean |error| of attainment
  replan_s, attainment_after_leave  4 GPUs of our plan leave (5% of GPUs on the 1,000-GPU
                                    cluster); the search is warm-started from our plan
  schedule_cpu_s, replan_cpu_s      the same searches' CPU time (wall-clock figures swing with
                                    the machine's load; CPU time much less)

`--objective throughput` plans for tokens/s with no deadline (`Workload.objective`): one row per
scenario, the searches offered SATURATION x the bound; attainment is then 1 by definition and
the figures that matter are capacity_tok_s and bound_ratio.

    python benchmarks/scheduler.py --json [--budget-s 15] [--loads 0.5 1.0] [--slo-scale 5]
                                          [--objective slo|throughput] [--save]

(--save: also write the rows to benchmarks/results/scheduler.json)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_results import save  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from hexswarm.routing.baselines.symmetric import SymmetricDP  # noqa: E402
from hexswarm.routing.baselines.table4 import table4_plan  # noqa: E402
from hexswarm.routing.scenarios.hexgen_clusters import SCENARIOS, scenario  # noqa: E402
from hexswarm.routing.scenarios.synthetic_cluster import synthetic_cluster  # noqa: E402
from hexswarm.routing.scheduler.bounds.capacity import SATURATION, allreduce_share, plan_capacity  # noqa: E402
from hexswarm.routing.scheduler.bounds.upper_bound import throughput_upper_bound  # noqa: E402
from hexswarm.routing.scheduler.model_spec import OBJECTIVES, Workload, preset  # noqa: E402
from hexswarm.routing.scheduler.plan import PipelinePlan, Plan, StagePlan  # noqa: E402
from hexswarm.routing.scheduler.plan_eval import (  # noqa: E402
    estimate_plan,
    evaluate_plan,
    memory_violations,
    plan_layouts,
)
from hexswarm.routing.scheduler.search.ga_fitness import estimated_score, simulated_score  # noqa: E402
from hexswarm.routing.scheduler.search.genetic import SearchConfig  # noqa: E402
from hexswarm.routing.scheduler.search.search import search  # noqa: E402
from hexswarm.routing.scheduler.search.search_result import SearchResult  # noqa: E402

SYNTHETIC = "synthetic-1000"
REPLAN_POPULATION = 6  # a re-plan's population, offspring and finalists (all of it simulated)
MODEL = preset("Llama-2-70B")


def cluster_of(name: str):
    return synthetic_cluster(1000, 50, seed=0) if name == SYNTHETIC else scenario(name)


def run_row(name: str, serving: str, load: float, args: argparse.Namespace) -> dict:
    """One scenario, serving model and load: our search, the baselines, a re-plan after a leave."""
    cluster = cluster_of(name)
    big = name == SYNTHETIC
    base = Workload(
        s_in=128, s_out=32, slo_scale=args.slo_scale, seed=args.seed, max_batch=16, objective=args.objective
    )
    bound_rps = throughput_upper_bound(cluster, MODEL, base, max_batch=16, prompt_tokens=128).requests_s
    rate = round(load * bound_rps, 1)
    requests = max(1000, round(rate * (args.trace_1000_s if big else args.trace_s)))
    workload = replace(base, rate=rate, num_requests=requests, serving=serving)
    budget = args.budget_1000_s if big else args.budget_s

    def config(**kw) -> SearchConfig:
        # capacity is measured after the search (below), so schedule_s and replan_s time the planning
        defaults = {
            "time_budget_s": budget,
            "stall_generations": args.stall,
            "seed": args.seed,
            "capacity": False,
        }
        return SearchConfig(**{**defaults, **kw})

    layouts: dict = {}  # layout cache shared by our search and the re-plan (same network)
    ours = search(cluster, MODEL, workload, config(), layout_cache=layouts)
    # The baseline gets our whole budget and no early stop: stopped after 30 flat generations at
    # half the budget it settled, on some rows, on plans 3-10% worse than it finds by running on.
    symmetric = search(cluster, MODEL, workload, config(layout_dp=SymmetricDP, stall_generations=0))
    pairs = _pairs(ours, workload) + _pairs(symmetric, workload)
    table4 = None
    if name == "heterogeneous-full-price":
        plan = table4_plan(cluster, MODEL)
        table4 = evaluate_plan(cluster, MODEL, workload, plan)
        if serving != "sequential":
            guess = estimate_plan(cluster, MODEL, workload, plan)
            pairs.append((estimated_score(guess, workload), simulated_score(table4, workload)))

    leaving = _leaving(ours, cluster, big, args.seed)
    smaller = cluster.without(leaving)
    replan_cfg = SearchConfig(  # a warm re-plan: a small population, an early stop, no polish
        population=REPLAN_POPULATION,
        offspring=REPLAN_POPULATION,
        time_budget_s=args.replan_1000_s if big else args.replan_s,
        stall_generations=args.replan_stall,
        seed=args.seed,
        finalists=REPLAN_POPULATION,
        polish_stall=0,
        capacity=False,
    )
    replan = search(smaller, MODEL, workload, replan_cfg, previous=ours.plan, layout_cache=layouts)
    within = all(
        not memory_violations(c, MODEL, workload, p)
        for c, p in ((cluster, ours.plan), (cluster, symmetric.plan), (smaller, replan.plan))
    )
    est = ours.plan.estimate
    seconds = args.capacity_1000_s if big else args.capacity_s
    our_layouts = plan_layouts(cluster, MODEL, workload, ours.plan)
    cap = plan_capacity(cluster, our_layouts, MODEL, workload, seconds)
    cap_sym = plan_capacity(
        cluster, plan_layouts(cluster, MODEL, workload, symmetric.plan), MODEL, workload, seconds
    )
    cap_after = plan_capacity(
        smaller, plan_layouts(smaller, MODEL, workload, replan.plan), MODEL, workload, seconds
    )
    return {
        "scenario": name,
        "serving": serving,
        "max_batch": est.max_batch,
        "load": load,
        "rate": rate,
        "requests": requests,
        "objective": args.objective,
        "slo_scale": args.slo_scale if workload.has_deadline else None,
        "slo_s": round(est.slo_s, 3) if workload.has_deadline else None,
        "devices": len(cluster),
        "devices_used": len(ours.plan.device_ids),
        "schedule_s": round(ours.elapsed_s, 2),
        "schedule_cpu_s": round(ours.cpu_s, 2),
        "generations": ours.generations,
        "attainment": round(ours.result.attainment, 4),
        "goodput_rps": round(ours.result.goodput_rps, 2),
        "throughput_tok_s": round(ours.result.throughput_tok_s, 1),
        "capacity_tok_s": round(cap.capacity_tok_s, 1),
        "slo_capacity_tok_s": round(cap.slo_capacity_tok_s, 1),
        "upper_bound_tok_s": round(cap.upper_bound_tok_s, 1),
        "bound_ratio": round(cap.bound_ratio, 3),
        "slo_bound_ratio": round(cap.slo_capacity_tok_s / cap.upper_bound_tok_s, 3),
        "slo_upper_bound_tok_s": round(cap.slo_upper_bound_tok_s, 1),
        "slo_capacity_vs_slo_bound": round(cap.slo_bound_ratio, 3),
        "throughput_ratio": round(ours.result.throughput_tok_s / est.upper_bound_tok_s, 3),
        "bound_ratio_symmetric": round(cap_sym.bound_ratio, 3),
        "allreduce_share": round(allreduce_share(cluster, our_layouts, MODEL, workload), 3),
        "p99_latency_s": round(ours.result.p99_latency_s, 3),
        "mean_latency_s": round(ours.result.mean_latency_s, 3),
        "attainment_symmetric": round(symmetric.result.attainment, 4),
        "goodput_symmetric": round(symmetric.result.goodput_rps, 2),
        "throughput_symmetric": round(symmetric.result.throughput_tok_s, 1),
        "attainment_table4": None if table4 is None else round(table4.attainment, 4),
        "goodput_table4": None if table4 is None else round(table4.goodput_rps, 2),
        "throughput_table4": None if table4 is None else round(table4.throughput_tok_s, 1),
        "fitness_vs_sim": _agreement(pairs, serving, relative=not workload.has_deadline),
        "replan_s": round(replan.elapsed_s, 2),
        "replan_cpu_s": round(replan.cpu_s, 2),
        "left": len(leaving),
        "attainment_after_leave": round(replan.result.attainment, 4),
        "bound_ratio_after_leave": round(cap_after.bound_ratio, 3),
        "within_memory": within,
        "pipelines": sorted((p.strategy for p in ours.plan.pipelines), key=lambda s: (len(s), s))[:40],
    }


def deep_rows(name: str, load: float, args: argparse.Namespace) -> list[dict]:
    """Deep-plan check: hand-built plans, one pipeline per 8-GPU machine at each TP layout of
    DEEP_LAYOUTS (equal layers per stage), Norway's 3 + 3 GPUs as [1, 2, 1, 2] and the A40s as
    [2, 2] (layers by memory), simulated at the row's rate like our plan."""
    cluster = scenario(name)
    base = Workload(s_in=128, s_out=32, slo_scale=args.slo_scale, seed=args.seed, max_batch=16)
    rate = round(
        load * throughput_upper_bound(cluster, MODEL, base, max_batch=16, prompt_tokens=128).requests_s, 1
    )
    workload = replace(base, rate=rate, num_requests=max(1000, round(rate * args.trace_s)))
    rows = []
    for tps in DEEP_LAYOUTS:
        machines = sorted({d.machine for d in cluster.devices})
        plan = hand_plan(cluster, {m: tps for m in machines if len(_ids_of(cluster, m)) == 8})
        result = evaluate_plan(cluster, MODEL, workload, plan)
        layouts = plan_layouts(cluster, MODEL, workload, plan)
        cap = plan_capacity(cluster, layouts, MODEL, workload, args.capacity_s)
        rows.append(
            {
                "scenario": name,
                "hand_plan_8gpu": tps,
                "rate": rate,
                "attainment": round(result.attainment, 4),
                "goodput_rps": round(result.goodput_rps, 2),
                "throughput_tok_s": round(result.throughput_tok_s, 1),
                "capacity_tok_s": round(cap.capacity_tok_s, 1),
                "bound_ratio": round(cap.bound_ratio, 3),
                "slo_capacity_tok_s": round(cap.slo_capacity_tok_s, 1),
                "slo_bound_ratio": round(cap.slo_capacity_tok_s / cap.upper_bound_tok_s, 3),
                "allreduce_share": round(allreduce_share(cluster, layouts, MODEL, workload), 3),
                "within_memory": not memory_violations(cluster, MODEL, workload, plan),
            }
        )
    return rows


DEEP_LAYOUTS = ([1] * 8, [2, 2, 2, 2], [4, 4])
SMALL_MACHINES = {
    3: [1, 2],
    4: [2, 2],
}  # TP layout of the machines with fewer GPUs, split in layers by memory


def _ids_of(cluster, machine: str) -> list[str]:
    return [d.id for d in cluster.devices if d.machine == machine]


def hand_plan(cluster, layouts: dict[str, list[int]]) -> Plan:
    """8-GPU machines as given (equal layers); Norway's two 3-GPU machines as one [1, 2, 1, 2]
    pipeline and each 4-GPU machine as [2, 2], layers in proportion to stage memory."""
    groups = [(_ids_of(cluster, m), tps, True) for m, tps in layouts.items()]
    small = sorted({d.machine for d in cluster.devices} - set(layouts))
    threes = [m for m in small if len(_ids_of(cluster, m)) == 3]
    if threes:
        groups.append(
            ([i for m in threes for i in _ids_of(cluster, m)], SMALL_MACHINES[3] * len(threes), False)
        )
    groups += [
        (_ids_of(cluster, m), SMALL_MACHINES[4], False) for m in small if len(_ids_of(cluster, m)) == 4
    ]
    pipelines = []
    for ids, tps, equal in groups:
        sizes = [float(t) if not equal else 1.0 for t in tps]
        bounds = [round(MODEL.num_layers * sum(sizes[:k]) / sum(sizes)) for k in range(len(tps) + 1)]
        cuts = [sum(tps[:k]) for k in range(len(tps) + 1)]
        stages = [
            StagePlan(tuple(ids[cuts[k] : cuts[k + 1]]), bounds[k], bounds[k + 1]) for k in range(len(tps))
        ]
        pipelines.append(PipelinePlan(tuple(stages)))
    return Plan(MODEL.name, MODEL.num_layers, tuple(pipelines))


def _pairs(result: SearchResult, workload: Workload) -> list[tuple[float, float]]:
    """(analytic, simulated) attainment of a search's finalists; without a deadline, the
    requests/s they serve (the fitness is then the estimated rate)."""
    return [(fitness[0], simulated_score(sim, workload)) for fitness, sim in result.finalists]


def _leaving(ours: SearchResult, cluster, big: bool, seed: int) -> set[str]:
    """4 GPUs of the plan, or 5% of the 1,000 GPUs drawn among those the plan uses."""
    if not big:
        return set(ours.plan.device_ids[:4])
    used = sorted(ours.plan.device_ids)
    return set(random.Random(seed).sample(used, min(len(used), len(cluster) // 20)))


def _agreement(pairs: list[tuple[float, float]], serving: str, relative: bool = False) -> dict:
    """Spearman rank correlation and mean |error| between estimated and simulated attainment
    (`relative`: mean |error| / simulated, for requests/s)."""
    if serving == "sequential":
        return {"note": "the fitness is the simulation itself", "spearman": 1.0, "mean_abs_error": 0.0}
    unique = sorted(set(pairs))
    est = [a for a, _ in unique]
    sim = [b for _, b in unique]
    rho = spearmanr(est, sim).statistic if len(unique) >= 3 else float("nan")
    if relative:  # requests/s: the error as a share of the simulated rate
        error = sum(abs(a - b) / b for a, b in unique if b > 0) / max(1, len(unique))
    else:
        error = sum(abs(a - b) for a, b in unique) / max(1, len(unique))
    return {
        "plans": len(unique),
        "spearman": None if rho != rho else round(float(rho), 3),
        "mean_abs_error": round(error, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON line per row (default: a table)")
    parser.add_argument(
        "--budget-s", type=float, default=15.0, help="budget of each §5.1 search (default 15)"
    )
    parser.add_argument("--budget-1000-s", type=float, default=48.0, help="budget on 1,000 GPUs (default 48)")
    parser.add_argument("--replan-s", type=float, default=2.5, help="re-plan budget (wall), §5.1 clusters")
    parser.add_argument(
        "--replan-stall", type=int, default=8, help="stop a re-plan after this many flat generations"
    )
    parser.add_argument("--replan-1000-s", type=float, default=4.0, help="re-plan budget, 1,000 GPUs")
    parser.add_argument(
        "--stall", type=int, default=30, help="stop a search after this many flat generations"
    )
    parser.add_argument("--loads", nargs="*", type=float, default=[0.5, 1.0], help="rates, x the bound")
    parser.add_argument("--trace-s", type=float, default=20.0, help="seconds of arrivals per trace")
    parser.add_argument("--trace-1000-s", type=float, default=4.0, help="the same on 1,000 GPUs")
    parser.add_argument("--capacity-s", type=float, default=20.0, help="seconds of saturating arrivals")
    parser.add_argument("--capacity-1000-s", type=float, default=10.0, help="the same on 1,000 GPUs")
    parser.add_argument("--slo-scale", type=float, default=5.0, help="deadline, x the A100 latency (§5.1: 5)")
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="slo",
        help="what the searches maximize; throughput: no deadline, one row per scenario at a saturating rate",
    )
    parser.add_argument("--seed", type=int, default=0)
    names = (*SCENARIOS, SYNTHETIC)
    parser.add_argument("--scenarios", nargs="*", default=list(names), choices=names)
    parser.add_argument("--serving", nargs="*", default=["pipelined-batched", "sequential"])
    parser.add_argument(
        "--deep-plans", action="store_true", help="the deep-plan check: hand-built plans only"
    )
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/scheduler.json")
    args = parser.parse_args(argv)
    rows = []
    if args.deep_plans:
        for name in ("heterogeneous-half-price", "heterogeneous-full-price"):
            for load in args.loads:
                for row in deep_rows(name, load, args):
                    print(json.dumps(row), flush=True)
        return 0
    for name in args.scenarios:
        for serving in args.serving:
            loads = args.loads[:1] if name == SYNTHETIC else args.loads  # one row each at 1,000 GPUs
            if args.objective == "throughput":
                loads = [SATURATION]  # the searches offer this rate whatever --loads says
            if name == SYNTHETIC and serving == "sequential":
                continue  # sequential serving on 1,000 GPUs adds minutes and nothing new
            for load in loads:
                row = run_row(name, serving, load, args)
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
                else:
                    print(
                        f"{name:26s} {serving:17s} rate {row['rate']:7.1f}  ours {row['attainment']:.3f} "
                        f"sym {row['attainment_symmetric']:.3f} t4 {row['attainment_table4']}  "
                        f"tok/s {row['throughput_tok_s']:.0f} bound {row['bound_ratio']:.2f}  "
                        f"schedule {row['schedule_s']:.1f} s replan {row['replan_s']:.1f} s",
                        flush=True,
                    )
    if args.save:
        save("scheduler", {"bench": "scheduler", "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
