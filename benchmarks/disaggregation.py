"""HexGen-2's disaggregated planner against HexGen's genetic plan and §5.3's truncated variant.

Cases: heterogeneous settings 1-5 of HexGen-2's Figure 4 (`routing/scenarios/hexgen2_settings.py`)
x the HPLD / HPHD / LPHD / LPLD workloads x Llama-2-70B and OPT-30B: 40 cases. Each search gets
the same fixed budget (`--budget-s`): our planner (max-flow-guided swaps), the truncated variant
(random swaps in their place, HexGen-2 §5.3) and HexGen's genetic search of a colocated plan
(`objective="throughput"`, as HexGen-2 plans; its generation cap lifted so the budget binds).
All three plans serve the same trace: Poisson arrivals for `--seconds` at 1.5 x the cluster's
upper bound (`upper_bound.py` without the prefill-decode coupling, which disaggregated plans do
not have), every request admitted, and each is measured by its steady generated tokens/s in the
saturated part of the run (`routing/disaggregation/simulation.py`). The colocated plan runs in
`serving_sim.py`, where a decode step waits behind every prefill on its stage (interference);
the disaggregated plans in `routing/disaggregation/simulation.py`, which moves each request's KV
cache over its link (Table 1) before decoding it. The colocated plan is measured twice: as
before, where interference costs latency only, and with the interference measured on a live
peer (`routing/scheduler/simulation/interference.py`), where a prefill next to decoding sequences also
costs its stage more time. The coordinator's chooser (`routing/disaggregation/choice.py`) then
picks between our plan and the genetic one on the same trace, as a live coordinator does.

One JSON line per case, fields:
  setting, workload, model
  throughput_disaggregated   our plan, event-simulated (tokens/s)
  throughput_genetic         HexGen's genetic plan (colocated), the same trace
  throughput_genetic_interference   the same plan and trace, interference costing tokens/s
  chosen, throughput_chosen  the chooser's pick ("disaggregated" or "colocated") and its
                             tokens/s (of the two above: ours, and the genetic plan's with
                             interference)
  throughput_truncated       the truncated variant's plan, the same trace
  estimate_error             (max-flow estimate - simulated) / simulated, our plan
  search_s                   our search's wall time
  estimate_tok_s             the max flow x generated tokens per request
  throughput_disaggregated_greedy   our plan with its decode replicas batching as the colocated
                             simulation does (whatever waits, up to max_batch) instead of in
                             fixed microbatches
  time_to_best_s, evaluations   when our search first reached its final flow; distinct
                             placements it evaluated (the same for the truncated variant)
  truncated_search_s, genetic_search_s, upper_bound_tok_s,
  prefill_replicas, decode_replicas, genetic_pipelines
and a last line with the means and the goals (`"summary": true`).

    python benchmarks/disaggregation.py [--budget-s 8] [--seconds 300] [--seed 0]
                                        [--settings 1 2 3 4 5] [--workloads HPLD ...] [--models ...]
                                        [--prefill-layout latency|throughput]
    python benchmarks/disaggregation.py --summarize ROWS.jsonl   # the summary line of saved case lines

--save [NAME] also writes the case lines and the summary to benchmarks/results/disaggregation.json,
or NAME.json (with --summarize too: the parts' lines and their summary).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from bench_results import save, stamp  # noqa: E402

from hexswarm.routing.disaggregation.choice import choose  # noqa: E402
from hexswarm.routing.disaggregation.planner import DisaggregationConfig, plan_disaggregated  # noqa: E402
from hexswarm.routing.disaggregation.simulation import (  # noqa: E402
    saturating_trace,
    simulate_colocated,
    simulate_disaggregated,
    steady_throughput,
)
from hexswarm.routing.scenarios.hexgen2_settings import SETTINGS, WORKLOADS, setting  # noqa: E402
from hexswarm.routing.scheduler.bounds.upper_bound import throughput_upper_bound  # noqa: E402
from hexswarm.routing.scheduler.model_spec import Workload, preset  # noqa: E402
from hexswarm.routing.scheduler.plan_eval import plan_layouts  # noqa: E402
from hexswarm.routing.scheduler.search.genetic import SearchConfig  # noqa: E402
from hexswarm.routing.scheduler.search.search import search  # noqa: E402

MODELS = ("Llama-2-70B", "OPT-30B")
MAX_BATCH = 32  # decode sequences a stage batches, for every plan
GOALS = {"vs_genetic": 1.4, "vs_truncated": 1.3, "search_s": 30.0, "estimate_error": 0.10}


def run_case(number: int, workload_name: str, model_name: str, args: argparse.Namespace) -> dict:
    cluster, model = setting(number), preset(model_name)
    s_in, s_out = WORKLOADS[workload_name]
    workload = Workload(s_in=s_in, s_out=s_out, max_batch=MAX_BATCH, objective="throughput", seed=args.seed)
    trace = saturating_trace(cluster, model, workload, args.seconds)
    bound = throughput_upper_bound(cluster, model, workload, MAX_BATCH, coupled_prompt_tokens=0.0)

    ours = plan_disaggregated(
        cluster,
        model,
        workload,
        DisaggregationConfig(args.budget_s, args.seed, prefill_layout=args.prefill_layout),
    )
    ours_tok_s = steady_throughput(trace, simulate_disaggregated(cluster, model, ours.plan, trace, workload))
    greedy_tok_s = steady_throughput(
        trace, simulate_disaggregated(cluster, model, ours.plan, trace, workload, microbatches=False)
    )
    truncated = plan_disaggregated(
        cluster,
        model,
        workload,
        DisaggregationConfig(args.budget_s, args.seed, swaps="random", prefill_layout=args.prefill_layout),
    )
    truncated_tok_s = steady_throughput(
        trace, simulate_disaggregated(cluster, model, truncated.plan, trace, workload)
    )
    config = SearchConfig(time_budget_s=args.budget_s, seed=args.seed, capacity=False, max_generations=10**6)
    started = time.perf_counter()
    genetic = search(cluster, model, workload, config)
    genetic_s = time.perf_counter() - started
    layouts = plan_layouts(cluster, model, workload, genetic.plan)
    genetic_tok_s = steady_throughput(trace, simulate_colocated(cluster, model, layouts, trace, MAX_BATCH))
    choice = choose(cluster, model, workload, genetic.plan, ours.plan, trace=trace)

    estimate = ours.plan.throughput_tok_s
    return {
        "setting": number,
        "workload": workload_name,
        "model": model_name,
        "throughput_disaggregated": round(ours_tok_s, 1),
        "throughput_genetic": round(genetic_tok_s, 1),
        "throughput_truncated": round(truncated_tok_s, 1),
        "estimate_error": round((estimate - ours_tok_s) / ours_tok_s, 4) if ours_tok_s else None,
        "search_s": round(ours.search_s, 2),
        "estimate_tok_s": round(estimate, 1),
        "throughput_disaggregated_greedy": round(greedy_tok_s, 1),
        "throughput_genetic_interference": round(choice.colocated_tok_s, 1),
        "chosen": "disaggregated" if choice.disaggregated else "colocated",
        "throughput_chosen": round(choice.chosen_tok_s, 1),
        "time_to_best_s": round(ours.time_to_best_s, 2),
        "evaluations": ours.evaluations,
        "truncated_search_s": round(truncated.search_s, 2),
        "truncated_time_to_best_s": round(truncated.time_to_best_s, 2),
        "truncated_evaluations": truncated.evaluations,
        "genetic_search_s": round(genetic_s, 2),
        "upper_bound_tok_s": round(bound.tok_s, 1),
        "prefill_replicas": [r.strategy for r in ours.plan.replicas if r.role == "prefill"],
        "decode_replicas": [r.strategy for r in ours.plan.replicas if r.role == "decode"],
        "genetic_pipelines": [p.strategy for p in genetic.plan.pipelines],
    }


def summary(rows: list[dict], wall_s: float | None) -> dict:
    ours = np.array([r["throughput_disaggregated"] for r in rows])
    vs_genetic = ours / np.array([r["throughput_genetic"] for r in rows])
    vs_truncated = ours / np.array([r["throughput_truncated"] for r in rows])
    errors = np.abs([r["estimate_error"] for r in rows if r["estimate_error"] is not None])
    search_s = np.array([r["search_s"] for r in rows])
    return {
        "summary": True,
        "cases": len(rows),
        "mean_vs_genetic": round(float(vs_genetic.mean()), 3),
        "min_vs_genetic": round(float(vs_genetic.min()), 3),
        "max_vs_genetic": round(float(vs_genetic.max()), 3),
        "mean_vs_truncated": round(float(vs_truncated.mean()), 3),
        "max_abs_estimate_error": round(float(errors.max()), 4) if len(errors) else None,
        "mean_abs_estimate_error": round(float(errors.mean()), 4) if len(errors) else None,
        "max_search_s": round(float(search_s.max()), 2),
        "mean_bound_ratio_disaggregated": round(
            float(np.mean([r["throughput_disaggregated"] / r["upper_bound_tok_s"] for r in rows])), 3
        ),
        "mean_bound_ratio_genetic": round(
            float(np.mean([r["throughput_genetic"] / r["upper_bound_tok_s"] for r in rows])), 3
        ),
        **chooser_summary(rows),
        "goals": GOALS,
        "wall_s": round(wall_s, 1) if wall_s is not None else None,
    }


def chooser_summary(rows: list[dict]) -> dict:
    """With interference costing tokens/s: ours against the genetic plan, per workload too, and
    what the chooser kept, against the better of the two on each case."""
    ours = np.array([r["throughput_disaggregated"] for r in rows])
    genetic = np.array([r["throughput_genetic"] for r in rows])
    interfered = np.array([r["throughput_genetic_interference"] for r in rows])
    chosen = np.array([r["throughput_chosen"] for r in rows])
    best = np.maximum(ours, interfered)
    by_workload = {}
    for name in dict.fromkeys(r["workload"] for r in rows):
        mask = np.array([r["workload"] == name for r in rows])
        by_workload[name] = {
            "vs_genetic": round(float((ours[mask] / genetic[mask]).mean()), 3),
            "vs_genetic_interference": round(float((ours[mask] / interfered[mask]).mean()), 3),
            "chosen_disaggregated": sum(
                r["chosen"] == "disaggregated" for r in rows if r["workload"] == name
            ),
        }
    return {
        "mean_vs_genetic_interference": round(float((ours / interfered).mean()), 3),
        "min_vs_genetic_interference": round(float((ours / interfered).min()), 3),
        "max_vs_genetic_interference": round(float((ours / interfered).max()), 3),
        "mean_genetic_interference_vs_genetic": round(float((interfered / genetic).mean()), 3),
        "by_workload": by_workload,
        "chosen_disaggregated": sum(r["chosen"] == "disaggregated" for r in rows),
        "chosen_ge_best_of_two": int(np.count_nonzero(chosen >= best)),
        "min_chosen_vs_best_of_two": round(float((chosen / best).min()), 3),
        "mean_chosen_vs_genetic_interference": round(float((chosen / interfered).mean()), 3),
        "mean_chosen_vs_disaggregated": round(float((chosen / ours).mean()), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget-s", type=float, default=8.0, help="each search's time budget")
    parser.add_argument("--seconds", type=float, default=300.0, help="seconds of arrivals in the trace")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", type=int, nargs="+", default=sorted(SETTINGS))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument(
        "--prefill-layout",
        choices=("latency", "throughput"),
        default="latency",
        help="prefill replicas' layouts: latency-optimal (HexGen-2 §3.3) or ranked by prefill capacity (ablation)",
    )
    parser.add_argument(
        "--summarize",
        metavar="ROWS",
        help="print only the summary line of the case lines in this file (runs split in parts)",
    )
    parser.add_argument(
        "--save",
        nargs="?",
        const="disaggregation",
        metavar="NAME",
        help="also write benchmarks/results/NAME.json",
    )
    args = parser.parse_args()
    stamped = stamp()
    if args.summarize:
        with open(args.summarize) as f:
            rows = [row for row in map(json.loads, f) if not row.get("summary")]
        line = summary(rows, None)
        if args.save:
            save(args.save, {"bench": "disaggregation", "rows": rows, "summary": line, "summarized": stamped})
        print(json.dumps(line), flush=True)
        return
    started = time.perf_counter()
    rows = []
    for model_name in args.models:
        for number in args.settings:
            for workload_name in args.workloads:
                row = run_case(number, workload_name, model_name, args)
                rows.append(row)
                print(json.dumps(row), flush=True)
    line = summary(rows, time.perf_counter() - started)
    if args.save:
        record = {"bench": "disaggregation", "rows": rows, "summary": line}
        save(
            args.save, {**record, "prefill_layout": args.prefill_layout, "started": stamped, "ended": stamp()}
        )
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
