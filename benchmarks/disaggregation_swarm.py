"""Disaggregated prefill and decode on a live swarm: does a long prompt still stall decoding?

SmolLM2-135M-Instruct (the `smollm2-135m` built-in model) on two CPU peers, each pinned to a
core of its own with `taskset` and running one torch thread, so that the two phases can run
on separate hardware even on this 2-core machine:

- colocated: `left` serves blocks 0:15 on core 0 and `right` 15:30 on core 1, both phases;
- disaggregated: `prefill` (`--role prefill`) serves 0:30 on core 0 and `decode`
  (`--role decode`) 0:30 on core 1; each prompt's keys and values move from one to the other.

Load, the same for both: 4 clients decode 48 tokens after a 16-token prompt, again and again,
while a fifth sends a prompt of `--prompt-tokens` (512) tokens every `--prompt-every` seconds.
Each decode client's time between tokens is recorded (a generate() stopping criterion notes
when each token came); the line reports its p50 and p99 per layout and their ratio (goal:
p99 disaggregated <= 0.5x colocated). `kv_bytes_per_prompt` is what the prefill peer says it
sent per long prompt (its log), against `kv_bytes_model` = prompt tokens x layers x 2 (keys
and values) x KV heads x head size x 4 bytes: the model's KV cache of that prompt. `exact`:
a long prompt's greedy continuation equals local transformers' in both layouts.

Time to first token, since a prefill peer may cost the first token what it saves the others:
`ttft_long_ms` is the median wall time of the long prompts' generate() (prefill, and in the
disaggregated layout the move of its keys and values, up to its first token), `ttft_short_ms`
the decode clients' median time to their first token.

`--repeats N` runs both layouts N times (alternating which goes first, so a drift in the
machine's load favours neither) and reports each run under `runs` and, under `summary`, the
median, min and max over the runs of every ratio and figure; the top-level ratios are the
medians. One 40-second run is not a figure: its p99 swings with whatever else the 2 cores run.

Run: python benchmarks/disaggregation_swarm.py [--seconds 40] [--prompt-tokens 512] [--repeats 5] [--save]
Prints one JSON line (--save: also benchmarks/results/disaggregation_swarm.json). Needs
`taskset` (util-linux) and at least 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

# Before torch loads: the clients share the machine's cores with the peers.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL
from hexswarm.swarm.tools.launcher import LocalSwarm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import save, spread  # noqa: E402
from ping_under_prefill import percentile  # noqa: E402  (the same nearest-rank percentile)

TEXT = (Path(__file__).resolve().parents[1] / "tests" / "data" / "two_cities.txt").read_text()
LAYOUTS = {
    "colocated": {"left": ("0:15", "0", ()), "right": ("15:30", "1", ())},
    "disaggregated": {
        "prefill": ("0:30", "0", ("--role", "prefill")),
        "decode": ("0:30", "1", ("--role", "decode")),
    },
}
DECODE_CLIENTS = 4
DECODE_TOKENS = 48
# per run: the figures summarized over --repeats (each per layout) and the ratios between layouts
FIGURES = ("p50_ms", "p99_ms", "ttft_long_ms", "ttft_short_ms", "gaps_over_250ms")
RATIOS = {"p99_ratio": "p99_ms", "p50_ratio": "p50_ms", "ttft_long_ratio": "ttft_long_ms"}
RATIOS["ttft_short_ratio"] = "ttft_short_ms"
SENT = re.compile(
    r"sent (\d+) tokens of keys and values, (\d+) bytes, to \d+ decode session\(s\) in (\d+) ms"
)


class TokenTimes(StoppingCriteria):
    """Notes when each new token arrives; never stops generation."""

    def __init__(self):
        self.began = time.perf_counter()
        self.times: list[float] = []

    def __call__(self, input_ids, scores, **kwargs):
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="load per layout")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--prompt-every", type=float, default=2.0, help="seconds between long prompts")
    parser.add_argument("--routing", default="tradeoff", help="the clients' router (docs/routing.md)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of both layouts")
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hexswarm.swarm.models.model_spec import load_model_spec

    torch.set_num_threads(1)
    spec = load_model_spec(DEFAULT_MODEL)
    tokenizer = AutoTokenizer.from_pretrained(spec.path)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    long = ids.repeat(1, args.prompt_tokens // ids.shape[1] + 1)[:, : args.prompt_tokens]
    short = ids[:, :16]
    local = AutoModelForCausalLM.from_pretrained(spec.path).eval()
    expected = local.generate(long, max_new_tokens=8, do_sample=False)
    del local
    result = {"bench": "disaggregation_swarm", "model": spec.model_id, "prompt_tokens": args.prompt_tokens}
    result["decode_clients"], result["seconds"], result["repeats"] = (
        DECODE_CLIENTS,
        args.seconds,
        args.repeats,
    )
    config = spec.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 4
    result["kv_bytes_model"] = args.prompt_tokens * per_token
    runs = [run_both(repeat, short, long, expected, args) for repeat in range(args.repeats)]
    result["failed_runs"] = [run["failed"] for run in runs if "failed" in run]
    runs = [run for run in runs if "failed" not in run]
    if not runs:
        raise SystemExit(f"every run failed: {result['failed_runs']}")
    result["summary"] = summarize_runs(runs)
    result.update({ratio: result["summary"][ratio]["median"] for ratio in RATIOS})
    sent = [r["kv_bytes_per_prompt_disaggregated"] for r in runs if "kv_bytes_per_prompt_disaggregated" in r]
    result["kv_ratio"] = round(statistics.median(sent) / result["kv_bytes_model"], 3) if sent else 0.0
    result["exact"] = all(r["exact"] for r in runs)
    result["runs"] = runs
    if args.save:
        save("disaggregation_swarm", result)
    print(json.dumps(result), flush=True)


def run_both(repeat: int, short, long, expected, args) -> dict:
    """Both layouts once, in turn; the first layout alternates between repeats."""
    order = list(LAYOUTS) if repeat % 2 == 0 else list(reversed(LAYOUTS))
    run, exact = {"first": order[0]}, True
    for layout in order:
        try:
            figures, same = run_layout(layout, LAYOUTS[layout], short, long, expected, args)
        except Exception as e:  # recorded: a run that failed is counted, not dropped silently
            run["failed"] = f"{layout}: {type(e).__name__}: {e}"[:500]
            print(json.dumps(run), file=sys.stderr, flush=True)
            return run
        run.update({f"{key}_{layout}": value for key, value in figures.items()})
        exact = exact and same
    for ratio, figure in RATIOS.items():
        run[ratio] = round(run[f"{figure}_disaggregated"] / run[f"{figure}_colocated"], 3)
    run["exact"] = exact
    print(json.dumps(run), file=sys.stderr, flush=True)  # progress: each run as it ends
    return run


def summarize_runs(runs: list[dict]) -> dict:
    """Median, min and max over the runs of each ratio and of each figure per layout."""
    keys = [*RATIOS, *(f"{figure}_{layout}" for figure in FIGURES for layout in LAYOUTS)]
    return {key: spread([run[key] for run in runs]) for key in keys}


def run_layout(layout: str, peers: dict, short, long, expected, args) -> tuple[dict, bool]:
    from hexswarm.client import DistributedModelForCausalLM

    with tempfile.TemporaryDirectory(prefix=f"hexswarm-{layout}-") as tmp, LocalSwarm(Path(tmp)) as swarm:
        swarm.start_bootstrap()
        procs = {
            name: swarm.start_peer(
                DEFAULT_MODEL,
                layers,
                name,
                "--threads",
                "1",
                *extra,
                wait=False,
                launcher=("taskset", "-c", core),
            )
            for name, (layers, core, extra) in peers.items()
        }
        for proc in procs.values():
            swarm.wait_for_log(proc, "online:", 240)
        model = DistributedModelForCausalLM.from_pretrained(
            DEFAULT_MODEL, initial_peers=swarm.initial_peers, routing=args.routing
        )
        try:
            got = model.generate(long, max_new_tokens=8, do_sample=False)  # also warms every path up
            exact = torch.equal(got, expected)
            route = model.last_route
            gaps, ttft_short, ttft_long = load(model, short, long, args)
        finally:
            model.shutdown()
        log = procs["prefill"].log() if "prefill" in procs else ""
        sent = [tuple(map(int, found)) for found in SENT.findall(log)]
        long_sends = [(b, ms) for t, b, ms in sent if t >= args.prompt_tokens]
    if not gaps:
        raise RuntimeError("no decode client produced two tokens")
    figures = {
        "p50_ms": round(statistics.median(gaps), 1),
        "p99_ms": round(percentile(gaps, 0.99), 1),
        "tokens": len(gaps),
        "gaps_over_250ms": sum(g > 250 for g in gaps),
        "ttft_long_ms": round(statistics.median(ttft_long), 1) if ttft_long else float("nan"),
        "long_prompts": len(ttft_long),
        "ttft_short_ms": round(statistics.median(ttft_short), 1),
        "route": route,
    }
    if long_sends:
        figures["kv_bytes_per_prompt"] = round(statistics.mean(b for b, _ in long_sends))
        figures["kv_send_ms"] = round(statistics.median(ms for _, ms in long_sends))
    return figures, exact


def load(model, short, long, args) -> tuple[list[float], list[float], list[float]]:
    """Times between tokens of the decode clients while long prompts arrive, their times to
    first token, and the long prompts' times to first token, all in ms."""
    stop, gaps, lock = threading.Event(), [], threading.Lock()
    ttft_short, ttft_long = [], []

    def decode_client():
        while not stop.is_set():
            times = TokenTimes()
            model.generate(
                short,
                max_new_tokens=DECODE_TOKENS,
                min_new_tokens=DECODE_TOKENS,
                do_sample=False,
                stopping_criteria=StoppingCriteriaList([times]),
            )
            with lock:
                gaps.extend(1000 * (b - a) for a, b in zip(times.times, times.times[1:], strict=False))
                ttft_short.append(1000 * (times.times[0] - times.began))

    def prompt_client():
        while not stop.wait(args.prompt_every):
            began = time.perf_counter()
            model.generate(long, max_new_tokens=1, do_sample=False)
            ttft_long.append(1000 * (time.perf_counter() - began))

    threads = [threading.Thread(target=decode_client) for _ in range(DECODE_CLIENTS)]
    threads.append(threading.Thread(target=prompt_client))
    for thread in threads:
        thread.start()
    time.sleep(args.seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=300)
    return gaps, ttft_short, ttft_long


if __name__ == "__main__":
    main()
