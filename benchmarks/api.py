"""The API server's added latency: streamed completions through `hexswarm api` vs. `generate()`.

Prints one JSON line. A bootstrap and two peers (the tiny model's layers split in half) run on
this machine; the same greedy generations are timed two ways, with 1 and with 8 concurrent
streams: `direct` calls `model.generate` with a streamer in this process (one thread per
stream), `api` streams `/v1/completions` with the `openai` package from a `hexswarm api`
process. Time to first token (TTFT) is from the call to the first token (direct) or first text
chunk (api); ms per token is (last - first) / (tokens - 1) of one stream. Figures are medians
(and minima) over all streams of all repeats; direct and API rounds alternate. Run:

    python benchmarks/api.py [--new-tokens 32] [--repeats 3] [--save]

(--save: also write the line to benchmarks/results/api.json)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Before torch loads: this process, the API server and the peers share this machine's cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from bench_results import save, stamp

from hexswarm.swarm.commands.tiny_model import make_tiny_model
from hexswarm.swarm.tools.launcher import LocalSwarm, free_port

SHAPE = dict(hidden=256, layers=8, heads=8, kv_heads=4)  # the "tiny" model of benchmarks/overhead.py
PROMPT_TOKENS = 16
CONCURRENCY = (1, 8)


class _Clock:
    """A generate() streamer that notes when each new token arrives (the prompt comes first)."""

    def __init__(self):
        self.times: list[float] = []
        self.prompt_seen = False

    def put(self, value) -> None:
        if self.prompt_seen:
            self.times.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass


def direct_stream(model, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    clock, began = _Clock(), time.perf_counter()
    model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, streamer=clock)
    return _figures(began, clock.times[0], clock.times[-1], len(clock.times))


def api_stream(client, name: str, prompt: list[int], new_tokens: int) -> tuple[float, float]:
    began, first, last, tokens = time.perf_counter(), None, None, 0
    stream = client.completions.create(
        model=name,
        prompt=prompt,
        max_tokens=new_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            last = time.perf_counter()
            first = first or last
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return _figures(began, first, last, tokens)


def _figures(began: float, first: float, last: float, tokens: int) -> tuple[float, float]:
    """(TTFT ms, ms per token after the first)."""
    return 1000 * (first - began), 1000 * (last - first) / max(tokens - 1, 1)


def one_round(one_stream, prompts: list[list[int]], concurrency: int) -> list[tuple[float, float]]:
    """`concurrency` streams started together; (TTFT ms, ms per token) of each."""
    start = threading.Barrier(concurrency)

    def timed(prompt):
        start.wait()
        return one_stream(prompt)

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(timed, prompts[:concurrency]))


def summary(samples: list[tuple[float, float]]) -> dict:
    ttft, per_token = [t for t, _ in samples], [p for _, p in samples]
    return {
        "ttft_ms": round(statistics.median(ttft), 1),
        "ttft_ms_min": round(min(ttft), 1),
        "ms_per_token": round(statistics.median(per_token), 2),
        "ms_per_token_min": round(min(per_token), 2),
    }


def compare(direct, api, prompts: list[list[int]], concurrency: int, repeats: int) -> dict:
    """Rounds of direct and API streams, interleaved so that load from elsewhere hits both alike."""
    d, a = [], []
    for _ in range(repeats):
        d += one_round(direct, prompts, concurrency)
        a += one_round(api, prompts, concurrency)
    d, a = summary(d), summary(a)
    return {
        "direct": d,
        "api": a,
        "added_ttft_ms": round(a["ttft_ms"] - d["ttft_ms"], 1),
        "added_ms_per_token": round(a["ms_per_token"] - d["ms_per_token"], 2),
    }


def pick_prompts(model_dir: Path, count: int, new_tokens: int) -> list[list[int]]:
    """Random prompts whose greedy continuation runs all `new_tokens` (no early end of sequence)
    and whose first token is whole text (the API holds back a partial UTF-8 character, which
    would delay its first chunk by a token and make TTFT unfair to it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local, tokenizer = (
        AutoModelForCausalLM.from_pretrained(model_dir),
        AutoTokenizer.from_pretrained(model_dir),
    )
    gen, prompts = torch.Generator().manual_seed(0), []
    while len(prompts) < count:
        prompt = torch.randint(3, 400, (1, PROMPT_TOKENS), generator=gen)
        out = local.generate(prompt, max_new_tokens=new_tokens, do_sample=False)[0, PROMPT_TOKENS:]
        first = tokenizer.decode(out[:1], skip_special_tokens=True)
        if len(out) == new_tokens and first and "\ufffd" not in first:
            prompts.append(prompt[0].tolist())
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/api.json")
    args = parser.parse_args()
    started = stamp()
    import openai

    from hexswarm.client import DistributedModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="hexswarm-bench-") as tmp:
        model_dir = make_tiny_model(Path(tmp) / "tiny", seed=0, **SHAPE)
        prompts = pick_prompts(model_dir, max(CONCURRENCY), args.new_tokens)
        half = SHAPE["layers"] // 2
        with LocalSwarm(Path(tmp) / "logs", env={"HEXSWARM_CACHE_DIR": str(Path(tmp) / "cache")}) as swarm:
            swarm.start_bootstrap()
            peers = [
                swarm.start_peer(model_dir, r, f"peer{i}", wait=False)
                for i, r in enumerate((f"0:{half}", f"{half}:8"))
            ]
            for proc in peers:
                swarm.wait_for_log(proc, "online:", timeout=300)
            port = free_port()
            swarm.start_command(
                "api",
                [
                    sys.executable,
                    "-m",
                    "hexswarm.swarm.commands.cli",
                    "api",
                    "--initial-peers",
                    *swarm.initial_peers,
                    "--model",
                    str(model_dir),
                    "--port",
                    str(port),
                ],
                ready="api: serving",
                timeout=300,
            )
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=5)
            model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.initial_peers)
            try:
                direct = lambda p: direct_stream(model, p, args.new_tokens)  # noqa: E731
                api = lambda p: api_stream(client, "tiny", p, args.new_tokens)  # noqa: E731
                direct(prompts[0]), api(prompts[0])  # warm up: first sessions, RTT measurements
                result = {
                    "bench": "api",
                    "new_tokens": args.new_tokens,
                    "prompt_tokens": PROMPT_TOKENS,
                    "repeats": args.repeats,
                    "torch_threads": torch.get_num_threads(),
                }
                for c in CONCURRENCY:
                    result[f"streams_{c}"] = compare(direct, api, prompts, c, args.repeats)
            finally:
                model.shutdown()
    print(json.dumps(result), flush=True)
    if args.save:
        save("api", {**result, "started": started, "ended": stamp()})


if __name__ == "__main__":
    main()
