"""What a batched decode step costs on this CPU: half a model's blocks, batch 1 vs. 4 vs. 8, in-process.

Prints one JSON line: per model size, the median CPU time (thread time, so other processes
on the machine do not inflate it) of one decode forward through half the layers with a KV
cache of 40 tokens, per batch size, and its ratio to batch 1. A ratio near 1 means decode is
memory-bound and stacking sessions is nearly free; a ratio near the batch size means it is
not. Run:

    python benchmarks/batch_cost.py [--sizes tiny medium] [--threads 1] [--steps 20] [--save]

(--save: also write the line to benchmarks/results/batch_cost.json)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see swarm/tools/threads.py)

import torch
from bench_results import save, stamp
from overhead import SIZES  # noqa: E402  (the same model shapes as the overhead benchmark)
from transformers import LlamaConfig, LlamaModel
from transformers.cache_utils import DynamicCache

BATCHES = (1, 4, 8)
CACHED_TOKENS = 40


def step_ms(model: LlamaModel, config: LlamaConfig, batch: int, steps: int) -> float:
    """Median CPU ms of one decode forward at `batch` rows after a prefill of CACHED_TOKENS."""
    cache = DynamicCache(config=config)
    model(
        inputs_embeds=torch.randn(batch, CACHED_TOKENS, config.hidden_size),
        past_key_values=cache,
        use_cache=True,
    )
    times = []
    for _ in range(steps):
        token = torch.randn(batch, 1, config.hidden_size)
        began = time.thread_time()
        model(inputs_embeds=token, past_key_values=cache, use_cache=True)
        times.append(time.thread_time() - began)
    return 1000 * statistics.median(times[3:])


def bench_size(shape: dict, steps: int) -> dict:
    config = LlamaConfig(
        hidden_size=shape["hidden"], num_hidden_layers=shape["layers"] // 2,
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        intermediate_size=int(shape["hidden"] * 2.6875), vocab_size=512,
    )  # fmt: skip
    model = LlamaModel(config).eval()
    with torch.inference_mode():
        ms = {batch: step_ms(model, config, batch, steps) for batch in BATCHES}
    return {
        "layers": config.num_hidden_layers, "hidden": config.hidden_size,
        "cpu_ms_per_step": {b: round(v, 2) for b, v in ms.items()},
        "ratio_to_batch_1": {b: round(v / ms[1], 2) for b, v in ms.items()},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/batch_cost.json")
    args = parser.parse_args()
    started = stamp()
    torch.set_num_threads(args.threads)
    result = {"bench": "batch_cost", "threads": args.threads, "cached_tokens": CACHED_TOKENS}
    for name in args.sizes:
        result[name] = bench_size(SIZES[name], args.steps)
    print(json.dumps(result), flush=True)
    if args.save:
        save("batch_cost", {**result, "started": started, "ended": stamp()})


if __name__ == "__main__":
    main()
