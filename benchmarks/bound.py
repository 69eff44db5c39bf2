"""The throughput upper bound (routing/scheduler/bounds/upper_bound.py) on the paper's clusters and at scale.

For the three §5.1 clusters and the seeded 1,000-GPU synthetic cluster, with Llama-2-70B and
prompts of 128 +- 50% tokens, it prints one JSON line with, per cluster and output length:
  tok_s            bound on generated tokens/s, prompts charged at the shortest length (strict)
  tok_s_mean_prompt  the same with prompts at the mean length (bound when every request is served)
  tok_s_batch1     the strict bound without batching (max_batch=1, e.g. today's sequential model)
  tok_s_uncoupled  the strict bound without the prefill/decode coupling row (devices may do only
                   prefill or only decode): what the coupling takes off
  binding          which resource limits the bound
  solve_s          median wall-clock time of one bound (build + HiGHS solve), over --repeats runs
Wall-clock figures are from a shared machine and are noisy.

    python benchmarks/bound.py [--max-batch 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hexswarm.routing.scenarios.hexgen_clusters import SCENARIOS, scenario  # noqa: E402
from hexswarm.routing.scenarios.synthetic_cluster import synthetic_cluster  # noqa: E402
from hexswarm.routing.scheduler.bounds.upper_bound import throughput_upper_bound  # noqa: E402
from hexswarm.routing.scheduler.cluster import Cluster  # noqa: E402
from hexswarm.routing.scheduler.model_spec import Workload, preset  # noqa: E402

OUTPUT_LENGTHS = (32, 64, 128)  # §5.1


def bound_row(name: str, cluster: Cluster, s_out: int, args: argparse.Namespace) -> dict:
    model = preset("Llama-2-70B")
    workload = Workload(s_in=128, s_out=s_out)
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        strict = throughput_upper_bound(cluster, model, workload, args.max_batch)
        times.append(time.perf_counter() - started)
    mean_prompt = throughput_upper_bound(
        cluster, model, workload, args.max_batch, prompt_tokens=workload.s_in
    )
    batch1 = throughput_upper_bound(cluster, model, workload, max_batch=1)
    uncoupled = throughput_upper_bound(cluster, model, workload, args.max_batch, coupled_prompt_tokens=0.0)
    return {
        "cluster": name,
        "gpus": len(cluster),
        "s_out": s_out,
        "tok_s": round(strict.tok_s, 1),
        "tok_s_mean_prompt": round(mean_prompt.tok_s, 1),
        "tok_s_batch1": round(batch1.tok_s, 1),
        "tok_s_uncoupled": round(uncoupled.tok_s, 1),
        "binding": strict.binding,
        "scan_share": round(strict.scan_share, 3),
        "solve_s": round(statistics.median(times), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    started = time.perf_counter()
    big = synthetic_cluster(1000, 50, seed=0)
    build_s = time.perf_counter() - started
    clusters = [(name, scenario(name)) for name in SCENARIOS] + [("synthetic-1000", big)]
    rows = [bound_row(name, cluster, s_out, args) for name, cluster in clusters for s_out in OUTPUT_LENGTHS]
    print(
        json.dumps(
            {
                "benchmark": "bound",
                "model": "Llama-2-70B",
                "max_batch": args.max_batch,
                "synthetic_build_s": round(build_s, 3),
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
