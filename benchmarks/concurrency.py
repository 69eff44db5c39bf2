"""Concurrency: aggregate tok/s and per-client ms/token for 1, 4, 8, 16 clients, batched vs. not.

Prints one JSON line. For each model size, a swarm of 2 peers with half the blocks each runs
on this machine twice: with batched decode (the defaults) and with `--no-batching`. N client
threads of one process (one DistributedModelForCausalLM, one swarm session each) start
together and each generate `--new-tokens` greedy tokens after a 16-token prompt. Figures:

- `agg_tok_s`: all new tokens / wall time from the first start to the last finish;
- `ms_per_token`: median over clients of (generate time after the first token) / (tokens - 1);
- `x_no_batching`: batched figure over the --no-batching one (tok/s: higher is better);
- `x_one_client`: aggregate tok/s over the 1-client figure of the same mode;
- `hop_ms`: per-step hop cost on the peers in the 1-client run (peer/hop_stats.py);
- `outputs_equal`: every client's output equals the local model's generate();
- `client_ms_per_token`: median over clients of the client's own time per token (its
  generate() less the time its session waited on the swarm: embeddings, LM head, sampling,
  the event loop hand-off);
- `peers` (batched runs): per peer, from the lines it logs every announce period: the decode
  batches it formed (`batches`: rows -> count, `mean_rows`), its compute thread's seconds in
  forwards over the clients' wall time (`busy_pct`; the rest it idled or waited for a batch),
  and its per-step `window_ms` (waiting for a batch on purpose), `queue_ms`, `compute_ms`,
  `in_ms` + `out_ms` (frame decoding, checks and encoding on its event loop).

Run:  python benchmarks/concurrency.py [--sizes tiny medium big] [--clients 1 4 8 16] [--new-tokens 32]
      [--peer-flags "--batch-window-ms 5"] [--skip-baseline]   (to tune the batching flags)
      [--save [NAME]]   (also write the line to benchmarks/results/concurrency.json, or NAME.json)
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

# Before torch loads: clients and peers share this machine's cores (see swarm/tools/threads.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import save, stamp  # noqa: E402
from overhead import PROMPT_TOKENS  # noqa: E402  (the same prompt as the overhead benchmark)
from overhead import SIZES as OVERHEAD_SIZES  # noqa: E402

# The overhead benchmark's models, and the Petals side-by-side's big one (its 32,000-token
# vocabulary makes each client's LM head read 131 MB a token, as Petals' clients do).
SIZES = {
    **OVERHEAD_SIZES,
    "big": dict(hidden=1024, layers=16, heads=8, kv_heads=8, intermediate=2752, vocab=32000),
}

from hexswarm.swarm.commands.tiny_model import make_tiny_model  # noqa: E402
from hexswarm.swarm.tools.launcher import LocalSwarm  # noqa: E402

ANNOUNCE_PERIOD = 2.0  # the peers log their hop cost once per period
HOP_LINE = re.compile(
    r"hop cost over (\d+) steps \(ms/step\): in ([\d.]+) queue ([\d.]+) window ([\d.]+) "
    r"compute ([\d.]+) out ([\d.]+)"
)
BATCH_LINE = re.compile(r"decode batches \(rows: count\) (\{[^}]*\}); compute busy ([\d.]+) s")


def prompts(n: int) -> list[torch.Tensor]:
    return [
        torch.randint(3, 400, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(i))
        for i in range(n)
    ]


def run_clients(model, inputs: list[torch.Tensor], new_tokens: int) -> dict:
    """All clients at once (a barrier); per-client timings and outputs."""
    barrier = threading.Barrier(len(inputs))
    results: list[dict] = [{} for _ in inputs]

    def client(i: int) -> None:
        barrier.wait()
        began = time.perf_counter()
        model.generate(inputs[i], max_new_tokens=1, do_sample=False)
        first = time.perf_counter()
        out = model.generate(inputs[i], max_new_tokens=new_tokens, do_sample=False)
        ended = time.perf_counter()
        results[i] = dict(
            began=began,
            ended=ended,
            output=out,
            ms_per_token=1000 * (ended - first - (first - began)) / (new_tokens - 1),
            client_ms_per_token=1000 * (ended - first - model.last_swarm_s) / new_tokens,
        )

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max(r["ended"] for r in results) - min(r["began"] for r in results)
    return dict(
        agg_tok_s=len(inputs) * (new_tokens + 1) / wall,
        wall_s=wall,
        ms_per_token=statistics.median(r["ms_per_token"] for r in results),
        client_ms_per_token=statistics.median(r["client_ms_per_token"] for r in results),
        outputs=[r["output"] for r in results],
    )


def peer_breakdown(proc, mark: int, wall_s: float) -> dict:
    """What one peer logged since `mark` (a log offset): the decode batches it formed, how busy
    its compute thread was, and where a step's time went (module docstring, `peers`)."""
    log = proc.log()[mark:]
    batches: collections.Counter[int] = collections.Counter()
    busy_s = 0.0
    for match in BATCH_LINE.finditer(log):
        batches.update({int(k): v for k, v in ast.literal_eval(match.group(1)).items()})
        busy_s += float(match.group(2))
    per_step = per_step_ms([log])
    rows = sum(k * v for k, v in batches.items())
    return {
        "batches": dict(sorted(batches.items())),
        "mean_rows": round(rows / max(1, sum(batches.values())), 2),
        "busy_pct": round(100 * busy_s / wall_s, 1),
        **{f"{name}_ms": per_step[name] for name in ("window", "queue", "compute", "in", "out")},
    }


def per_step_ms(logs: list[str]) -> dict[str, float]:
    """Step-weighted mean of the hop-cost lines in `logs`, per part (in, queue, window, compute, out)."""
    totals, steps = [0.0] * 5, 0
    for log in logs:
        for match in HOP_LINE.finditer(log):
            n = int(match.group(1))
            steps += n
            totals = [t + n * float(x) for t, x in zip(totals, match.groups()[1:], strict=True)]
    names = ("in", "queue", "window", "compute", "out")
    return {k: round(t / max(1, steps), 3) for k, t in zip(names, totals, strict=True)}


def hop_cost(peers, marks: list[int]) -> dict:
    """Step-weighted mean of the hop-cost lines the peers logged since `marks` (log offsets)."""
    per_step = per_step_ms([proc.log()[mark:] for proc, mark in zip(peers, marks, strict=True)])
    per_step["overhead"] = round(per_step["in"] + per_step["queue"] + per_step["out"], 3)
    return per_step


def bench_mode(model_dir, shape, name, workdir, flags, counts, new_tokens, expected) -> dict:
    from hexswarm.client import DistributedModelForCausalLM

    half = shape["layers"] // 2
    env = {"HEXSWARM_CACHE_DIR": str(workdir / "cache")}
    with LocalSwarm(workdir / f"{name}-logs-{len(flags)}", env=env) as swarm:
        swarm.start_bootstrap()
        peers = [
            swarm.start_peer(
                model_dir,
                layers,
                f"{name}-{i}",
                "--announce-period",
                str(ANNOUNCE_PERIOD),
                "--max-sessions",
                "32",
                "--max-sessions-per-peer",  # every client thread is one remote: allow them all
                "32",
                *flags,
                wait=False,
            )
            for i, layers in enumerate((f"0:{half}", f"{half}:{shape['layers']}"))
        ]
        for proc in peers:
            swarm.wait_for_log(proc, "online:", timeout=300)
        model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.initial_peers)
        try:
            model.generate(prompts(1)[0], max_new_tokens=4, do_sample=False)  # warm-up
            figures = {}
            for n in counts:
                time.sleep(ANNOUNCE_PERIOD + 0.5)  # the last period's hop line is out
                marks = [len(p.log()) for p in peers]
                run = run_clients(model, prompts(n), new_tokens)
                figures[n] = dict(
                    agg_tok_s=round(run["agg_tok_s"], 2),
                    ms_per_token=round(run["ms_per_token"], 2),
                    client_ms_per_token=round(run["client_ms_per_token"], 2),
                    outputs_equal=all(
                        torch.equal(o, e) for o, e in zip(run["outputs"], expected, strict=False)
                    ),
                )
                time.sleep(ANNOUNCE_PERIOD + 0.5)  # the run's last period is logged
                if n == 1:
                    figures[n]["hop_ms"] = hop_cost(peers, marks)
                if "--no-batching" not in flags:
                    figures[n]["peers"] = [
                        peer_breakdown(p, m, run["wall_s"]) for p, m in zip(peers, marks, strict=True)
                    ]
        finally:
            model.shutdown()
    return figures


def bench_size(
    name: str,
    shape: dict,
    workdir: Path,
    counts: list[int],
    new_tokens: int,
    peer_flags: list[str],
    skip_baseline: bool,
) -> dict:
    from transformers import AutoModelForCausalLM

    model_dir = make_tiny_model(workdir / name, seed=0, **shape)
    local = AutoModelForCausalLM.from_pretrained(model_dir)
    expected = [local.generate(p, max_new_tokens=new_tokens, do_sample=False) for p in prompts(max(counts))]
    one = prompts(1)[0]
    began = time.perf_counter()
    local.generate(one, max_new_tokens=1, do_sample=False)
    first = time.perf_counter()
    local.generate(one, max_new_tokens=new_tokens, do_sample=False)
    local_ms = 1000 * (time.perf_counter() - first - (first - began)) / (new_tokens - 1)
    del local
    batched = bench_mode(model_dir, shape, name, workdir, peer_flags, counts, new_tokens, expected)
    result = {"hidden": shape["hidden"], "layers": shape["layers"], "local_ms_per_token": round(local_ms, 2)}
    result["one_client_x_local"] = round(batched[counts[0]]["ms_per_token"] / local_ms, 2)
    if skip_baseline:
        return {**result, **{f"{n}_clients": batched[n] for n in counts}}
    baseline = bench_mode(
        model_dir, shape, name, workdir, [*peer_flags, "--no-batching"], counts, new_tokens, expected
    )
    for n in counts:
        b, u = batched[n], baseline[n]
        result[f"{n}_clients"] = {
            "batched": b,
            "no_batching": u,
            "x_no_batching": round(b["agg_tok_s"] / u["agg_tok_s"], 2),
            "x_one_client": round(b["agg_tok_s"] / batched[counts[0]]["agg_tok_s"], 2),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--sizes", nargs="+", default=list(OVERHEAD_SIZES), choices=list(SIZES))
    parser.add_argument("--peer-flags", default="", help="extra run-peer flags for both modes")
    parser.add_argument("--skip-baseline", action="store_true", help="no --no-batching run")
    parser.add_argument(
        "--save",
        nargs="?",
        const="concurrency",
        metavar="NAME",
        help="also write benchmarks/results/NAME.json",
    )
    args = parser.parse_args()
    started = stamp()
    with tempfile.TemporaryDirectory(prefix="hexswarm-bench-") as tmp:
        result = {
            "bench": "concurrency",
            "peer_flags": args.peer_flags,
            "new_tokens": args.new_tokens,
            "prompt_tokens": PROMPT_TOKENS,
            "torch_threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
        }
        for name in args.sizes:
            result[name] = bench_size(
                name,
                SIZES[name],
                Path(tmp),
                args.clients,
                args.new_tokens,
                args.peer_flags.split(),
                args.skip_baseline,
            )
    print(json.dumps(result), flush=True)
    if args.save:
        save(args.save, {**result, "started": started, "ended": stamp()})


if __name__ == "__main__":
    main()
