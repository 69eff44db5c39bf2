"""Chain-router benchmark: one JSON line per swarm size (Explorative Study, §II-B).

    python benchmarks/router.py --json [--sizes 10,100,500] [--requests 1000] [--loads 0.3,0.6,0.9]
        [--seeds 0] [--all-modes-max-peers 100] [--load-only | --fronts-only]

Per size: a seeded synthetic swarm (routing.scenarios.synthetic_swarm, 80 blocks), then
- fresh_ms / fresh_ms_median: the fastest / median of 5 full NSGA-II runs (our chain
  encoding, seeded by routing.chains.sweep_seeds), and the seed's matrix encoding's (one run);
- cached_decision_ms_p50/_p99: TradeoffRouter.choose served from the cached front (no own
  picks counted); loaded_decision_ms_p50/_p99: the same with the client's own picks counted
  (routing.chains.own_picks), each decision re-scoring the pool (routing.chains.loaded_pool);
- front_size and hypervolume of our front, the seed encoding's and the epsilon-constraint
  sweep's (objectives normalised by the sweep front's ranges, reference point (1.1, 1.1));
- latency_gap_vs_dijkstra: best latency on our front / the exact min-latency chain's;
- load: routing.sim.load_sim with Poisson arrivals at each of `--loads` x the swarm's
  sustainable rate (load_sim.sustainable_rate: compute LP and KV-cache bound), the
  same arrivals for every mode: mean and p99 request latency (s, arrival to last token,
  waiting for cache included) and total generated tokens/s. Above `--all-modes-max-peers`
  only min_latency and the default tradeoff run: max_throughput and the knee take chains of
  30-60 hops at 500 peers, which made that size alone take ~20 min, and they lose anyway.

With several `--seeds`, one row per seed and size, then one summary line: per size, the
median and worst over seeds of the hypervolume ratio and the median fresh run time, and per size, load
and mode, the median and the worst over seeds of p99 latency and tokens/s, and for
tradeoff its worst ratio to min_latency on the same seed (p99: tradeoff / min_latency,
tokens/s: min_latency / tradeoff; above 1.02 is a loss of more than 2%).

Each row also holds the fronts themselves (`front_points`: our front's and the sweep's
[latency ms, throughput] pairs, and the exact min-latency chain's latency). `--save` writes
every row and the summary to benchmarks/results/router.json, or NAME.json with `--save NAME`
(charts.py draws the fronts from router.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

import numpy as np

from hexswarm.routing.baselines.matrix_nsga import matrix_front
from hexswarm.routing.baselines.reference_front import normalised_hypervolume, sweep_front
from hexswarm.routing.chains.cost import candidates
from hexswarm.routing.chains.front import Front
from hexswarm.routing.chains.min_latency import min_latency_route
from hexswarm.routing.chains.nsga import NsgaConfig, nsga_front
from hexswarm.routing.chains.routers import make_router
from hexswarm.routing.chains.swarm_view import RouteRequest, SwarmView
from hexswarm.routing.chains.tradeoff import TradeoffRouter
from hexswarm.routing.scenarios.synthetic_swarm import SwarmSpec, generate_swarm
from hexswarm.routing.sim.load_sim import LoadSpec, simulate_load, sustainable_rate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_results import save, stamp  # noqa: E402

REQUEST = RouteRequest(prompt_tokens=128, new_tokens=32, batch_size=1)
LOAD_MODES = (  # (column name, mode, options)
    ("min_latency", "min_latency", {}),
    ("max_throughput", "max_throughput", {}),
    ("tradeoff", "tradeoff", {}),  # the default: load-aware front, DEFAULT_PREFERENCE
    ("tradeoff_knee", "tradeoff", {"preference": "knee"}),
)


def timed_ms(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1e3, out


def hypervolume(front: Front, reference: Front) -> float:
    """hexswarm.routing.baselines.reference_front.normalised_hypervolume, rounded (the reference is the sweep's front)."""
    return round(normalised_hypervolume(front, reference), 4)


def decision_times(view: SwarmView, seed: int) -> dict:
    fresh, cpu = [], []
    for _ in range(5):
        start = time.process_time()  # CPU time too: on a shared machine the wall clock waits for others
        fresh.append(timed_ms(lambda: TradeoffRouter(seed=seed, background=False).refresh(view, REQUEST))[0])
        cpu.append((time.process_time() - start) * 1e3)
    out = {
        "fresh_ms": round(min(fresh), 1),
        "fresh_ms_median": round(float(np.median(fresh)), 1),
        "fresh_cpu_ms_median": round(float(np.median(cpu)), 1),
    }
    for name, account in (("cached", False), ("loaded", True)):
        router = TradeoffRouter(seed=seed, background=False, account_picks=account)
        router.refresh(view, REQUEST)
        samples = [timed_ms(lambda r=router: r.choose(view, REQUEST))[0] for _ in range(500)]
        out[f"{name}_decision_ms_p50"] = round(float(np.percentile(samples, 50)), 4)
        out[f"{name}_decision_ms_p99"] = round(float(np.percentile(samples, 99)), 4)
    return out


def fronts(view: SwarmView, seed: int) -> dict:
    cands = candidates(view, REQUEST)
    config = NsgaConfig(seed=seed)
    ours = nsga_front(cands, config)
    no_anchor = nsga_front(cands, replace(config, anchors=False))
    seed_ms, seed_front = timed_ms(lambda: matrix_front(cands, config))
    sweep_ms, sweep = timed_ms(lambda: sweep_front(cands))
    best = min_latency_route(view, REQUEST).latency_ms
    return {
        "front_size": len(ours),
        "hypervolume": hypervolume(ours, sweep),
        "hypervolume_no_anchors": hypervolume(no_anchor, sweep),
        "hypervolume_seed_encoding": hypervolume(seed_front, sweep),
        "hypervolume_sweep": hypervolume(sweep, sweep),
        "hypervolume_ratio": round(hypervolume(ours, sweep) / max(hypervolume(sweep, sweep), 1e-12), 3),
        "seed_encoding_fresh_ms": round(seed_ms, 1),
        "sweep_ms": round(sweep_ms, 1),
        "sweep_front_size": len(sweep),
        "latency_gap_vs_dijkstra": round(float(ours.latency_ms[0]) / best, 4),
        "latency_gap_no_anchors": round(float(no_anchor.latency_ms[0]) / best, 4),
        "latency_gap_seed_encoding": round(float(seed_front.latency_ms[0]) / best, 4)
        if len(seed_front)
        else None,
        "front_points": {"ours": points(ours), "sweep": points(sweep), "min_latency_ms": round(best, 2)},
    }


def points(front: Front) -> list[list[float]]:
    """[latency ms, throughput] of each route on the front, by latency."""
    return [
        [round(float(a), 2), round(float(b), 4)]
        for a, b in zip(front.latency_ms, front.throughput, strict=True)
    ]


def load_test(view: SwarmView, requests: int, load: float, seed: int, all_modes: bool = True) -> dict:
    """Every mode on the same arrivals (same seed) at `load` x the swarm's sustainable rate.

    all_modes=False runs only min_latency and the default tradeoff (same arrivals still).
    """
    rate = load * sustainable_rate(view, REQUEST)
    spec = LoadSpec(num_requests=requests, rate_per_s=rate, request=REQUEST, seed=seed)
    out: dict = {"load": load, "rate_per_s": round(rate, 2)}
    for name, mode, kw in LOAD_MODES:
        if not all_modes and name not in ("min_latency", "tradeoff"):
            continue
        extra = {"background": False, "seed": seed} if mode == "tradeoff" else {}
        res = simulate_load(view, make_router(mode, **kw, **extra), spec)
        out[name] = {
            "mean_latency_s": round(res.mean_latency_s, 2),
            "p99_latency_s": round(res.p99_latency_s, 2),
            "tokens_per_s": round(res.tokens_per_s, 1),
            "mean_hops": round(res.mean_hops, 1),
            "completed": res.completed,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per line (the only output format)"
    )
    parser.add_argument("--sizes", default="10,100,500")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument(
        "--loads", default="0.3,0.6,0.9", help="arrival rates as shares of the sustainable rate"
    )
    parser.add_argument("--seeds", default="0", help="comma-separated swarm and arrival seeds")
    parser.add_argument(
        "--all-modes-max-peers",
        type=int,
        default=100,
        help="larger swarms load-test only min_latency and the default tradeoff (the slow modes lose)",
    )
    parser.add_argument(
        "--load-only", action="store_true", help="skip the run times and fronts: only the load test"
    )
    parser.add_argument(
        "--serial-peers",
        action="store_true",
        help="peers decode one session at a time (and announce it) instead of batching",
    )
    parser.add_argument(
        "--fronts-only", action="store_true", help="skip the load test: only run times and fronts"
    )
    parser.add_argument(
        "--save", nargs="?", const="router", metavar="NAME", help="also write benchmarks/results/NAME.json"
    )
    args = parser.parse_args()
    started = stamp()
    seeds = [int(x) for x in args.seeds.split(",")]
    nsga_front(candidates(generate_swarm(SwarmSpec(10, seed=seeds[0])), REQUEST))  # warm up imports
    rows = []
    for seed in seeds:
        for size in (int(s) for s in args.sizes.split(",")):
            spec = SwarmSpec(num_peers=size, num_blocks=80, seed=seed, batching=not args.serial_peers)
            view = generate_swarm(spec)
            row = {"peers": size, "blocks": view.num_blocks, "seed": seed, "batching": spec.batching}
            if not args.load_only:
                row |= decision_times(view, seed) | fronts(view, seed)
            all_modes = size <= args.all_modes_max_peers
            loads = [] if args.fronts_only else [float(x) for x in args.loads.split(",")]
            row["load"] = [load_test(view, args.requests, x, seed, all_modes) for x in loads]
            rows.append(row)
            print(json.dumps(row), flush=True)
    totals = summary(rows) if len(seeds) > 1 else None
    if totals:
        print(json.dumps(totals), flush=True)
    if args.save:
        save(
            args.save,
            {"bench": "router", "rows": rows, "summary": totals, "started": started, "ended": stamp()},
        )


def summary(rows: list[dict]) -> dict:
    """Median and worst over seeds per (size, load, mode), and tradeoff's worst ratio to min_latency."""
    out: dict = {"summary": True, "seeds": sorted({r["seed"] for r in rows}), "fronts": [], "cells": []}
    for size in sorted({r["peers"] for r in rows}):
        by_seed = [r for r in rows if r["peers"] == size]
        if "hypervolume_ratio" in by_seed[0]:
            ratio = [r["hypervolume_ratio"] for r in by_seed]
            fresh = [r["fresh_ms_median"] for r in by_seed]
            cpu = [r["fresh_cpu_ms_median"] for r in by_seed]
            out["fronts"].append(
                {
                    "peers": size,
                    "hypervolume_ratio_median": round(float(np.median(ratio)), 3),
                    "hypervolume_ratio_worst": min(ratio),
                    "fresh_ms_median": round(float(np.median(fresh)), 1),
                    "fresh_ms_worst": max(fresh),
                    "fresh_cpu_ms_median": round(float(np.median(cpu)), 1),
                    "fresh_cpu_ms_worst": max(cpu),
                }
            )
        for k, cell in enumerate(by_seed[0]["load"]):
            loads = [r["load"][k] for r in by_seed]
            entry: dict = {"peers": size, "load": cell["load"]}
            for mode in (m for m, _, _ in LOAD_MODES if all(m in x for x in loads)):
                p99 = [x[mode]["p99_latency_s"] for x in loads]
                tps = [x[mode]["tokens_per_s"] for x in loads]
                entry[mode] = {
                    "p99_median": round(float(np.median(p99)), 2),
                    "p99_worst": max(p99),
                    "tokens_per_s_median": round(float(np.median(tps)), 1),
                    "tokens_per_s_worst": min(tps),
                }
            p99_ratio = [x["tradeoff"]["p99_latency_s"] / x["min_latency"]["p99_latency_s"] for x in loads]
            tps_ratio = [x["min_latency"]["tokens_per_s"] / x["tradeoff"]["tokens_per_s"] for x in loads]
            entry["tradeoff_vs_min_latency_worst"] = {
                "p99_ratio": round(max(p99_ratio), 3),
                "tokens_per_s_ratio": round(max(tps_ratio), 3),
            }
            out["cells"].append(entry)
    return out


if __name__ == "__main__":
    main()
