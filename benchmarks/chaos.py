"""Chaos benchmark: greedy generations while peers of the chain are killed, stopped or made to fail.

Starts a bootstrap and five redundant peers of a tiny 6-block model (swarm.tools.chaos.LAYOUT) on
127.0.0.1. Each run generates from a seeded prompt; after seeded tokens a peer of the chain
in use is SIGKILLed, SIGSTOPped or made to answer errors/NaN (peer.faults); the client fails
over; the peers are healed (killed ones restarted) before the next run. Prints one JSON line:
runs, exact runs (output equal to the local model's, which is the no-failure output),
median and p99 recovery time (fault -> next token), retries used, and leftover processes.

    python benchmarks/chaos.py --runs 100 [--faults 1] [--new-tokens 12] [--seed 0] [--save]

(--save: also write the line to benchmarks/results/chaos.json)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_results import save

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see swarm.tools.launcher)

import numpy as np

from hexswarm.swarm.commands.tiny_model import make_tiny_model
from hexswarm.swarm.tools.chaos import LAYOUT, ChaosSwarm, chaos_run, child_processes
from hexswarm.swarm.tools.launcher import LocalSwarm

RUNS_PER_CLIENT = 10  # a fresh client now and then, so its bans of healed peers do not pile up


def run_all(workdir: Path, runs: int, faults: int, new_tokens: int, seed: int) -> dict:
    from transformers import AutoModelForCausalLM

    from hexswarm.client import DistributedModelForCausalLM

    model_dir = make_tiny_model(workdir / "model", layers=6, hidden=128, heads=4, kv_heads=2, seed=0)
    local = AutoModelForCausalLM.from_pretrained(model_dir)
    results, began = [], time.monotonic()
    env = {"HEXSWARM_CACHE_DIR": str(workdir / "cache")}
    with LocalSwarm(workdir / "logs", env=env) as local_swarm:
        local_swarm.start_bootstrap()
        chaos = ChaosSwarm(local_swarm, model_dir, LAYOUT)
        chaos.start()
        for first in range(0, runs, RUNS_PER_CLIENT):
            model = DistributedModelForCausalLM.from_pretrained(
                model_dir, initial_peers=local_swarm.initial_peers
            )
            try:
                for run in range(first, min(runs, first + RUNS_PER_CLIENT)):
                    chaos.settle(max_starting=1)  # at most one restarted peer still loading
                    results.append(chaos_run(model, local, chaos, seed + run, new_tokens, faults))
                    print(json.dumps(_progress(results[-1])), file=sys.stderr, flush=True)
            finally:
                model.shutdown()
    leftovers = chaos.leftovers()
    time.sleep(1)
    return _summary(results, time.monotonic() - began, leftovers, child_processes())


def _progress(r) -> dict:
    return {
        "seed": r.seed,
        "exact": r.exact,
        "faults": [
            (f.peer, f.action, None if f.recovery_s is None else round(f.recovery_s, 3)) for f in r.faults
        ],
        "retries": r.retries,
        "route": r.route,
    }


def _summary(results, wall_s: float, leftovers: list[int], children: list[int]) -> dict:
    recoveries = [f.recovery_s for r in results for f in r.faults if f.recovery_s is not None]
    by_action = {}
    for action in ("kill", "stop", "error"):
        times = [
            f.recovery_s for r in results for f in r.faults if f.action == action and f.recovery_s is not None
        ]
        by_action[action] = {"n": len(times), "median_s": _round(statistics.median(times)) if times else None}
    return {
        "bench": "chaos",
        "runs": len(results),
        "exact_runs": sum(r.exact for r in results),
        "faults": len(recoveries),
        "recovery_median_s": _round(statistics.median(recoveries)) if recoveries else None,
        "recovery_p99_s": _round(float(np.percentile(recoveries, 99))) if recoveries else None,
        "recovery_by_action": by_action,
        "retries_used": sum(r.retries for r in results),
        "leftover_processes": len(leftovers) + len(children),
        "wall_s": round(wall_s, 1),
    }


def _round(x: float) -> float:
    return round(x, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--faults", type=int, default=1, help="peers hurt per run")
    parser.add_argument("--new-tokens", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/chaos.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hexswarm-chaos-") as tmp:
        result = run_all(Path(tmp), args.runs, args.faults, args.new_tokens, args.seed)
    if args.save:
        save("chaos", result)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
