"""How good and how fast the HexGen scheduler is on the paper's clusters (HexGen §5.1, §5.4).

For each scenario and output length (32, 64, 128) it runs the genetic search and reports,
on the same simulated trace (Llama-2-70B, Poisson arrivals, SLO scale 5):
  attainment                  our plan
  attainment_table4           HexGen's Table 4 plan (full-price cluster only)
  attainment_random_mutation  the same search with random mutations (§5.4 ablation)
  attainment_symmetric        best plan whose stages share one TP degree and layer count
  replan_s, attainment_after_leave   4 GPUs of the plan leave; warm-started re-plan
The request rate is `--rate` at 32 output tokens and scales as 32 / s_out, so every row
offers the swarm the same number of generated tokens per second.

    python benchmarks/scheduler.py --json [--budget-s 15] [--rate 8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from routing.scheduler.genetic import SearchConfig, search  # noqa: E402
from routing.scheduler.model_spec import Workload, preset  # noqa: E402
from routing.scheduler.plan_eval import evaluate_plan, memory_violations  # noqa: E402
from routing.scheduler.scenarios import SCENARIOS, scenario, table4_plan  # noqa: E402

REPLAN_BUDGET_S = 2.5
LEAVING = 4


def run_row(name: str, s_out: int, args: argparse.Namespace) -> dict:
    """One scenario at one output length: our search, the baselines, and a re-plan after a leave."""
    cluster, model = scenario(name), preset("Llama-2-70B")
    workload = Workload(rate=args.rate * 32 / s_out, s_in=128, s_out=s_out, slo_scale=5.0, seed=args.seed)

    def config(**kw) -> SearchConfig:
        return SearchConfig(time_budget_s=args.budget_s, stall_generations=args.stall, seed=args.seed, **kw)

    ours = search(cluster, model, workload, config())
    random_mut = search(cluster, model, workload, config(mutation="random"))
    symmetric = search(cluster, model, workload, config(symmetric=True))
    table4 = None
    if name == "heterogeneous-full-price":
        table4 = evaluate_plan(cluster, model, workload, table4_plan(cluster, model)).attainment

    leaving = set(ours.plan.device_ids[:LEAVING])
    smaller = cluster.without(leaving)
    replan_cfg = SearchConfig(
        time_budget_s=REPLAN_BUDGET_S, stall_generations=args.stall // 2, seed=args.seed
    )
    replan = search(smaller, model, workload, replan_cfg, previous=ours.plan)

    plans = [
        (cluster, ours.plan),
        (cluster, random_mut.plan),
        (cluster, symmetric.plan),
        (smaller, replan.plan),
    ]
    within = all(not memory_violations(c, model, workload, p) for c, p in plans)
    return {
        "scenario": name,
        "s_out": s_out,
        "rate": workload.rate,
        "slo_s": round(ours.plan.estimate.slo_s, 3),
        "devices": len(cluster),
        "schedule_s": round(ours.elapsed_s, 2),
        "generations": ours.generations,
        "attainment": ours.result.attainment,
        "attainment_table4": table4,
        "attainment_random_mutation": random_mut.result.attainment,
        "attainment_symmetric": symmetric.result.attainment,
        "replan_s": round(replan.elapsed_s, 2),
        "attainment_after_leave": replan.result.attainment,
        "left": sorted(leaving),
        "within_memory": within,
        "pipelines": [p.strategy for p in ours.plan.pipelines],
        "plan": ours.plan.to_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON line per row (default: a table)")
    parser.add_argument(
        "--budget-s", type=float, default=15.0, help="time budget of each search (default 15)"
    )
    parser.add_argument(
        "--stall", type=int, default=60, help="stop a search after this many flat generations"
    )
    parser.add_argument("--rate", type=float, default=8.0, help="requests/s at 32 output tokens (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--s-out", nargs="*", type=int, default=[32, 64, 128])
    args = parser.parse_args(argv)
    for name in args.scenarios:
        for s_out in args.s_out:
            row = run_row(name, s_out, args)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                t4 = "-" if row["attainment_table4"] is None else f"{row['attainment_table4']:.3f}"
                print(
                    f"{name:26s} s_out={s_out:<4d} schedule {row['schedule_s']:6.2f} s  ours {row['attainment']:.3f}  "
                    f"table4 {t4}  random {row['attainment_random_mutation']:.3f}  "
                    f"symmetric {row['attainment_symmetric']:.3f}  replan {row['replan_s']:.2f} s -> "
                    f"{row['attainment_after_leave']:.3f}  memory ok {row['within_memory']}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
