"""Churn benchmark: a swarm of volunteer GPUs over an hour, three ways of placing layers.

A seeded swarm of about `--gpus` GPUs (the catalog's mix, `--regions` regions; peers are
machines) churns for `--minutes`: sessions are exponential with a 30-minute mean and newcomers
keep the population steady (`routing/scenarios/churn_process.py`). The same Poisson request
trace (Llama-2-70B, prompts 64-192 tokens, 32 output tokens, SLO scale 5, `--load` x the
initial swarm's upper bound in requests/s) is served under each policy
(`routing/sim/churn_policy.py`, the baselines in `routing/baselines/petals_policy.py`):

  coordinator  hexswarm's: re-plan (`replan.py`: the genetic search warm-started, moves costed
               make-before-break) `--debounce-s` (20) after a join or leave, and every
               `--period-s` (60) re-opening one region in turn; published past `--margin`
               (2%; 0.5% when no placed peer moves); each search runs `--generations` (12)
               generations per region group, the first plan `--initial-generations` (60), so a
               run is deterministic per seed (the wall-clock budgets are only caps).
               Ablations: `--break-before-make` (value a moving peer as serving nothing while it
               loads), `--no-moves` (re-plans only place new or idle peers); knobs measured
               and not adopted: `--tie`, `--reopen-regions`, `--plan-headroom` (docs/benchmarks.md "Churn")
  petals       Petals' rule as Petals 2.2.0 runs it (`petals_rule.py`): join on the weakest
               blocks, a rebalance check per server after a uniform wait (mean 120 s); one
               server per machine over its largest power-of-two TP group (as if Petals' TP,
               tested on BLOOM only, worked for Llama)
  petals-gpu   the same rule with one server per GPU: Petals' default (a server gets one
               device unless given `--tensor_parallel_devices`) and its maintainers' advice
               for several GPUs
  petals-peers the same rule with one TP server per `--peer-gpus` GPUs: Petals deployed as
               the coordinator's peers are (named petals-<k>gpu; skipped when k is 0 or 1)
  no-replan    the initial plan (the coordinator's), leavers vanish, joiners take Petals' join
               placement

`--peer-gpus k` is how volunteers deploy hexswarm: one `run-peer --layers auto` per k GPUs of a
machine (the last peer takes the rest), 0 for one peer per machine. The scheduler plans one stage
per peer at a TP degree of at most its GPUs; two peers of one machine still talk over its bus
(`churn_process.split_machines`), and a machine leaves with all its peers.

Joiners serve once loaded (layer bytes / `--load-gbps`); a Petals server that moves restarts,
a coordinator's peer moves make-before-break when its memory holds both ranges. Every 30 s the
loaded peers' spans become disjoint chains and serve the next 8 s of the trace in the event
simulation (`routing/sim/churn_sim.py`). One JSON line: per policy the SLO attainment and tokens/s
per period (5 min) and over the run, split into samples within `--after-leave-s` (60) of a
leave and the others, moves, ranges loaded; the coordinator's re-plan times
(wall clock, noisy on a shared machine) p50 / p99; weights loaded (GB, all peers and by
moving ones); ratios to both forms of Petals' rule. `timeline`, per policy and sample (every
`--sample-s`): the minute, the share of that sample's requests that met the SLO and the GPUs in
complete chains; `gpus_present`: the GPUs in the swarm at each sample (coverage = in chains /
present). `--save` also writes the line to benchmarks/results/churn.json (charts.py draws it), or
to NAME.json with `--save NAME`.

    python benchmarks/churn.py [--seed 0] [--gpus 200] [--minutes 60] [--peer-gpus 4] [--save [NAME]]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hexswarm.routing.baselines.petals_policy import PetalsPolicy, StaticPolicy  # noqa: E402
from hexswarm.routing.scenarios.churn_process import draw_churn, split_machines  # noqa: E402
from hexswarm.routing.scheduler.bounds.upper_bound import throughput_upper_bound  # noqa: E402
from hexswarm.routing.scheduler.model_spec import Workload, preset  # noqa: E402
from hexswarm.routing.scheduler.replan.moves import MoveCosts  # noqa: E402
from hexswarm.routing.scheduler.replan.replan import REPLAN_CONFIG, replan  # noqa: E402
from hexswarm.routing.scheduler.simulation.simulator import make_trace  # noqa: E402
from hexswarm.routing.sim.churn_policy import CoordinatorPolicy  # noqa: E402
from hexswarm.routing.sim.churn_sim import Sampling, run  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_results import save, stamp  # noqa: E402

MODEL = preset("Llama-2-70B")
POLICIES = ("coordinator", "petals", "petals-gpu", "petals-peers", "no-replan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpus", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--regions", type=int, default=6)
    parser.add_argument("--load", type=float, default=0.3, help="offered rate, x the initial swarm's bound")
    parser.add_argument("--load-gbps", type=float, default=8.0, help="peers read new layers at this (Gbit/s)")
    parser.add_argument(
        "--generations", type=int, default=12, help="GA generations per re-plan search (per region group)"
    )
    parser.add_argument(
        "--initial-generations", type=int, default=60, help="GA generations of the first plan"
    )
    parser.add_argument(
        "--replan-budget-s",
        type=float,
        default=60.0,
        help="wall-clock cap per re-plan (the generations bind first)",
    )
    parser.add_argument("--initial-budget-s", type=float, default=300.0)
    parser.add_argument(
        "--margin", type=float, default=0.02, help="publish a plan that moves peers past this"
    )
    parser.add_argument("--horizon-s", type=float, default=600.0, help="plans are valued over this long")
    parser.add_argument(
        "--tie", type=float, default=0.005, help="candidates this close count as equal (fewest moves wins)"
    )
    parser.add_argument(
        "--debounce-s", type=float, default=20.0, help="re-plan this long after a join or leave"
    )
    parser.add_argument("--period-s", type=float, default=60.0, help="periodic re-plan")
    parser.add_argument("--reopen-regions", type=int, default=1, help="regions a periodic re-plan re-opens")
    parser.add_argument(
        "--break-before-make", action="store_true", help="value moves as if a moving peer served nothing"
    )
    parser.add_argument("--no-moves", action="store_true", help="re-plans only place new or idle peers")
    parser.add_argument(
        "--plan-headroom",
        type=float,
        default=1.0,
        help="the coordinator plans for this x the offered rate (its estimate saturates at the rate)",
    )
    parser.add_argument(
        "--peer-gpus",
        type=int,
        default=4,
        help="the coordinator's machines run one peer per this many GPUs (0: one peer per machine)",
    )
    parser.add_argument("--after-leave-s", type=float, default=60.0, help="a sample this soon after a leave")
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument(
        "--save", nargs="?", const="churn", metavar="NAME", help="also write benchmarks/results/NAME.json"
    )
    parser.add_argument("--window-s", type=float, default=8.0)
    parser.add_argument(
        "--policies",
        nargs="*",
        default=list(POLICIES),
        choices=POLICIES,
    )
    args = parser.parse_args(argv)
    started, stamped = time.perf_counter(), stamp()
    churn = draw_churn(args.gpus, args.regions, args.minutes, seed=args.seed)
    first = churn.cluster(set(churn.initial))
    planned_churn = split_machines(churn, args.peer_gpus) if args.peer_gpus else churn
    base = Workload(s_in=128, s_out=32, slo_scale=5.0, max_batch=16, seed=args.seed, num_requests=300)
    bound = throughput_upper_bound(first, MODEL, base, max_batch=16, prompt_tokens=128).requests_s
    workload = replace(base, rate=round(args.load * bound, 1))
    trace = make_trace(
        MODEL, replace(workload, num_requests=int(workload.rate * churn.duration_s * 1.05) + 10)
    )
    config = replace(
        REPLAN_CONFIG, time_budget_s=args.replan_budget_s, seed=args.seed, max_generations=args.generations
    )
    # the coordinator's first plan: the search, then pipelines of the machines it left idle
    first_config = replace(
        config,
        time_budget_s=args.initial_budget_s,
        stall_generations=20,
        max_generations=args.initial_generations,
    )
    planned = replace(workload, rate=workload.rate * args.plan_headroom)
    initial = replan(planned_churn.cluster(set(churn.initial)), MODEL, planned, None, first_config)
    costs = MoveCosts(
        load_bandwidth=args.load_gbps * 1e9 / 8,
        horizon_s=args.horizon_s,
        margin=args.margin,
        tie=args.tie,
        make_before_break=not args.break_before_make,
        move_placed=not args.no_moves,
    )
    sampling = Sampling(sample_s=args.sample_s, window_s=args.window_s, load_bandwidth=costs.load_bandwidth)
    policies = {
        "coordinator": lambda: CoordinatorPolicy(
            MODEL,
            planned,
            initial.plan,
            costs,
            config,
            debounce_s=args.debounce_s,
            period_s=args.period_s,
            reopen_regions=args.reopen_regions,
        ),
        "petals": lambda: PetalsPolicy(MODEL, workload, seed=args.seed),
        "petals-gpu": lambda: PetalsPolicy(MODEL, workload, seed=args.seed, server_gpus=1),
        "petals-peers": lambda: PetalsPolicy(MODEL, workload, seed=args.seed, server_gpus=args.peer_gpus),
        "no-replan": lambda: StaticPolicy(
            MODEL, workload, initial.plan, seed=args.seed, server_gpus=args.peer_gpus
        ),
    }
    leaves = [e.time_s for e in churn.events if e.kind == "leave"]
    rows = {}
    for name in args.policies:
        if name == "petals-peers" and args.peer_gpus in (0, 1):
            continue  # the same as petals / petals-gpu
        t0 = time.perf_counter()
        swarm = planned_churn if name in ("coordinator", "no-replan") else churn
        result = run(swarm, policies[name](), MODEL, workload, trace, sampling)
        att, tok = result.per_period(sampling.period_s)
        name = result.name if name == "petals-peers" else name
        rows[name] = {
            "attainment": round(result.attainment(), 4),
            "throughput_tok_s": round(result.throughput(), 1),
            "attainment_split": result.split_attainment(leaves, args.after_leave_s),
            "attainment_per_period": [round(a, 3) for a in att],
            "throughput_per_period": [round(t, 1) for t in tok],
            "moves": result.moves,
            "moves_of_serving_peers": result.moves_serving,
            "ranges_loaded": result.loads,
            "loaded_gb": round(result.loaded_gb, 1),
            "moved_gb": round(result.moved_gb, 1),
            "replans": len(result.replan_s),
            "replan_p50_s": _pct(result.replan_s, 50),
            "replan_p99_s": _pct(result.replan_s, 99),
            "replan_cpu_p50_s": _pct(result.replan_cpu_s, 50),
            "replan_cpu_p99_s": _pct(result.replan_cpu_s, 99),
            "serving_gpus_mean": round(float(np.mean(result.serving_gpus)), 1) if result.serving_gpus else 0,
            "timeline": timeline(result),
            "run_s": round(time.perf_counter() - t0, 1),
        }
    joins = sum(e.kind == "join" for e in churn.events)
    out = {
        "benchmark": "churn",
        "seed": args.seed,
        "gpus": sum(len(churn.devices[m]) for m in churn.initial),
        "gpus_present_mean": round(
            float(
                np.mean(
                    [
                        sum(len(churn.devices[m]) for m in churn.present(t))
                        for t in range(0, int(churn.duration_s), 60)
                    ]
                )
            ),
            1,
        ),
        "peers": len(churn.initial),
        "regions": args.regions,
        "minutes": args.minutes,
        "joins": joins,
        "leaves": len(churn.events) - joins,
        "rate_rps": workload.rate,
        "slo_s": round(trace.deadline_s, 3),
        "initial_plan_s": round(initial.elapsed_s, 2),
        "initial_pipelines": len(initial.plan.pipelines),
        "load_gbps": args.load_gbps,
        "coordinator_flags": {
            "generations": args.generations,
            "initial_generations": args.initial_generations,
            "margin": args.margin,
            "tie": args.tie,
            "horizon_s": args.horizon_s,
            "debounce_s": args.debounce_s,
            "period_s": args.period_s,
            "reopen_regions": args.reopen_regions,
            "break_before_make": args.break_before_make,
            "no_moves": args.no_moves,
            "plan_headroom": args.plan_headroom,
        },
        "policies": rows,
    }
    sample_times = [s[0] for s in result.samples] if rows else []
    out["gpus_present"] = [sum(len(churn.devices[m]) for m in churn.present(t)) for t in sample_times]
    for baseline in [n for n in rows if n.startswith("petals")]:
        if baseline in rows and rows[baseline]["attainment"] > 0:
            for name in rows:
                rows[name][f"attainment_vs_{baseline.replace('-', '_')}"] = round(
                    rows[name]["attainment"] / rows[baseline]["attainment"], 3
                )
    out["wall_s"] = round(time.perf_counter() - started, 1)
    if args.save:
        save(args.save, {**out, "started": stamped, "ended": stamp()})
    print(json.dumps(out))
    return 0


def timeline(result) -> dict:
    """Per sample: its minute, the share of its requests that met the SLO (None without
    requests) and the GPUs in complete chains."""
    return {
        "minute": [round(s[0] / 60, 2) for s in result.samples],
        "attainment": [round(s[1] / s[2], 3) if s[2] else None for s in result.samples],
        "gpus_in_chains": list(result.serving_gpus),
    }


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


if __name__ == "__main__":
    sys.exit(main())
