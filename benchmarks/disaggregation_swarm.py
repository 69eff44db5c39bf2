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

Run: python benchmarks/disaggregation_swarm.py [--seconds 40] [--prompt-tokens 512]
Prints one JSON line. Needs `taskset` (util-linux) and at least 2 cores.
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

from hexswarm.swarm.builtin_models import DEFAULT_MODEL
from hexswarm.swarm.launcher import LocalSwarm

sys.path.insert(0, str(Path(__file__).resolve().parent))
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
SENT = re.compile(
    r"sent (\d+) tokens of keys and values, (\d+) bytes, to \d+ decode session\(s\) in (\d+) ms"
)


class TokenTimes(StoppingCriteria):
    """Notes when each new token arrives; never stops generation."""

    def __init__(self):
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
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hexswarm.swarm.model_spec import load_model_spec

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
    result["decode_clients"], result["seconds"] = DECODE_CLIENTS, args.seconds
    exact = True
    for layout, peers in LAYOUTS.items():
        figures, same = run_layout(layout, peers, short, long, expected, args)
        result.update({f"{key}_{layout}": value for key, value in figures.items()})
        exact = exact and same
    result["p99_ratio"] = round(result["p99_ms_disaggregated"] / result["p99_ms_colocated"], 3)
    config = spec.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 4
    result["kv_bytes_model"] = args.prompt_tokens * per_token
    result["kv_ratio"] = round(
        result.get("kv_bytes_per_prompt_disaggregated", 0) / result["kv_bytes_model"], 3
    )
    result["exact"] = exact
    print(json.dumps(result), flush=True)


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
            gaps = load(model, short, long, args)
        finally:
            model.shutdown()
        log = procs["prefill"].log() if "prefill" in procs else ""
        sent = [tuple(map(int, found)) for found in SENT.findall(log)]
        long_sends = [(b, ms) for t, b, ms in sent if t >= args.prompt_tokens]
    figures = {
        "p50_ms": round(statistics.median(gaps), 1),
        "p99_ms": round(percentile(gaps, 0.99), 1),
        "tokens": len(gaps),
        "gaps_over_250ms": sum(g > 250 for g in gaps),
        "route": route,
    }
    if long_sends:
        figures["kv_bytes_per_prompt"] = round(statistics.mean(b for b, _ in long_sends))
        figures["kv_send_ms"] = round(statistics.median(ms for _, ms in long_sends))
    return figures, exact


def load(model, short, long, args) -> list[float]:
    """Times between tokens of the decode clients while long prompts arrive, in ms."""
    stop, gaps, lock = threading.Event(), [], threading.Lock()

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

    def prompt_client():
        while not stop.wait(args.prompt_every):
            model.generate(long, max_new_tokens=1, do_sample=False)

    threads = [threading.Thread(target=decode_client) for _ in range(DECODE_CLIENTS)]
    threads.append(threading.Thread(target=prompt_client))
    for thread in threads:
        thread.start()
    time.sleep(args.seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=300)
    return gaps


if __name__ == "__main__":
    main()
