"""SmolLM2-135M-Instruct (the `smollm2-135m` GGUF) through a 2-peer swarm against local transformers.

Prints one JSON line. Every swarm figure has its local baseline from the same run:

- `load_s_peer` / `rss_mb_peer`: a fresh process loading blocks 0:15 as a peer does (BlockStack)
  up to its first answered step, against `load_s_local` / `rss_mb_local`: a fresh process loading
  the whole model with transformers up to its first forward, both from the same cached checkpoint
  folder (RSS: what that added to the process). The peer holds half the blocks, so its totals
  are about half the whole model's by construction; the ratios compare them per block
  (`load_ms_per_block_*`, `rss_mb_per_block_*`: the total over the blocks loaded, the whole
  model's embeddings and LM head counted in its 30 blocks). `load_s_local_gguf` is
  transformers reading the GGUF file itself, for reference.
- `ms_per_token` (greedy decode after the first token, 16-token prompt) and `ttft_ms` (a
  256-token prompt) through peers 0:15 and 15:30, against `*_local`.
- `tok_s_1_client` and `tok_s_4_clients`: aggregate tokens/s of 1 and 4 concurrent generate() calls.
- `swarm_start_s`: from launching the bootstrap to `hexswarm status` exiting 0 (every block
  covered), polled as the side-by-side harness with Petals polls it; `bootstrap_s` and
  `peers_online_s` say where that time went.
- `exact`: the swarm's greedy tokens equal the local model's.

Run: python benchmarks/real_model.py [--repeats 3] [--new-tokens 32] [--save]
(--save: also write the line to benchmarks/results/real_model.json)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Before torch loads: local baseline, client and peers share this machine's cores (see swarm.tools.launcher).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from hexswarm.swarm.models import gguf_checkpoint
from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL
from hexswarm.swarm.tools.launcher import COLOCATED_ENV, LocalSwarm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import save  # noqa: E402

PEERS = {"left": "0:15", "right": "15:30"}
PEER_BLOCKS = 15  # the load figures' peer serves blocks 0:15
TEXT = (Path(__file__).resolve().parents[1] / "tests" / "data" / "two_cities.txt").read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/real_model.json")
    parser.add_argument(
        "--child", choices=("load-peer", "load-local", "load-local-gguf"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_load(args.child)), flush=True)
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hexswarm.swarm.models.model_spec import load_model_spec

    spec = load_model_spec(DEFAULT_MODEL)  # converts the GGUF's metadata once (cached)
    gguf_checkpoint.materialize_all(spec.path)  # every weight file, for the local baseline
    result = {"bench": "real_model", "model": spec.model_id, "torch_threads": torch.get_num_threads()}
    result.update(load_figures())
    result.update(per_block(result, peer_blocks=PEER_BLOCKS, model_blocks=spec.num_blocks))
    local = AutoModelForCausalLM.from_pretrained(spec.path).eval()
    tokenizer = AutoTokenizer.from_pretrained(spec.path)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    short, long = ids[:, :16], ids[:, :256]
    local_out, local_ms = decode_ms(local, short, args.new_tokens, args.repeats)
    result["ms_per_token_local"] = round(local_ms, 2)
    result["ttft_ms_local"] = round(ttft_ms(local, long, args.repeats), 1)
    del local
    with tempfile.TemporaryDirectory(prefix="hexswarm-real-") as tmp:
        with LocalSwarm(Path(tmp)) as swarm:  # peers keep their measured speed in ~/.cache, as users' do
            result.update(start_swarm(swarm))
            result.update(swarm_figures(swarm, short, long, local_out, args))
    result["ratios"] = {
        "load_per_block": round(result["load_ms_per_block_peer"] / result["load_ms_per_block_local"], 3),
        "rss_per_block": round(result["rss_mb_per_block_peer"] / result["rss_mb_per_block_local"], 3),
        "ms_per_token": round(result["ms_per_token"] / result["ms_per_token_local"], 3),
        "ttft_ms": round(result["ttft_ms"] / result["ttft_ms_local"], 3),
        "tok_s_4_over_1": round(result["tok_s_4_clients"] / result["tok_s_1_client"], 3),
    }
    if args.save:
        save("real_model", result)
    print(json.dumps(result), flush=True)


def load_figures() -> dict:
    """Each load in a fresh process of its own, run in turn so they do not share the cores."""
    figures = {}
    for child, key in (("load-peer", "peer"), ("load-local", "local"), ("load-local-gguf", "local_gguf")):
        runs = [run_child(child) for _ in range(3 if child != "load-local-gguf" else 1)]
        figures[f"load_s_{key}"] = round(statistics.median(r["load_s"] for r in runs), 3)
        figures[f"rss_mb_{key}"] = round(statistics.median(r["rss_mb"] for r in runs), 1)
    return figures


def per_block(figures: dict, peer_blocks: int, model_blocks: int) -> dict:
    """Load time (ms) and memory (MB) per block loaded: the peer's over its blocks, the whole
    model's over all of its blocks."""
    return {
        "load_ms_per_block_peer": round(1000 * figures["load_s_peer"] / peer_blocks, 2),
        "load_ms_per_block_local": round(1000 * figures["load_s_local"] / model_blocks, 2),
        "rss_mb_per_block_peer": round(figures["rss_mb_peer"] / peer_blocks, 2),
        "rss_mb_per_block_local": round(figures["rss_mb_local"] / model_blocks, 2),
    }


def run_child(child: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", child], capture_output=True, text=True, check=True, timeout=600
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_load(child: str) -> dict:
    """Seconds from loading to the first answered step (a one-token forward, which also pages in
    the memory-mapped weights), and the resident MB that added; the libraries and the model's
    modules are imported before the clock starts, as a running process would have them."""
    import transformers.models.llama.modeling_llama  # noqa: F401 - imported by both ways of loading
    from transformers import AutoModelForCausalLM, DynamicCache

    from hexswarm.peer.blocks import BlockStack
    from hexswarm.swarm.models.builtin_models import BUILTIN_MODELS, builtin_path
    from hexswarm.swarm.models.model_spec import load_model_spec

    spec = load_model_spec(DEFAULT_MODEL)
    token = torch.tensor([[1]])
    before, began = rss_mb(), time.perf_counter()
    with torch.inference_mode():
        if child == "load-peer":
            loaded = BlockStack.load(spec, 0, PEER_BLOCKS, torch.float32, torch.device("cpu"))
            loaded(torch.zeros(1, 1, spec.hidden_size), loaded.new_cache("s"), 0, 0, PEER_BLOCKS)
        elif child == "load-local":
            loaded = AutoModelForCausalLM.from_pretrained(spec.path)
            loaded(token, cache=DynamicCache())
        else:
            gguf = builtin_path(BUILTIN_MODELS[DEFAULT_MODEL])
            loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
            loaded(token)
    elapsed, added = time.perf_counter() - began, rss_mb() - before  # while `loaded` is alive
    return {"load_s": elapsed, "rss_mb": added, "parameters": sum(p.numel() for p in loaded.parameters())}


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def decode_ms(model, input_ids: torch.Tensor, new_tokens: int, repeats: int) -> tuple[torch.Tensor, float]:
    """(the greedy output, median ms per token after the first)."""
    per_token, output = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        model.generate(input_ids, max_new_tokens=1, do_sample=False)
        first = time.perf_counter() - began
        began = time.perf_counter()
        output = model.generate(
            input_ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
        )
        per_token.append(1000 * (time.perf_counter() - began - first) / (new_tokens - 1))
    return output, statistics.median(per_token)


def ttft_ms(model, input_ids: torch.Tensor, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        model.generate(input_ids, max_new_tokens=1, do_sample=False)
        times.append(1000 * (time.perf_counter() - began))
    return statistics.median(times)


def start_swarm(swarm: LocalSwarm) -> dict:
    """Bootstrap, then both peers launched at once, then `hexswarm status` polled about once a
    second (as the side-by-side harness with Petals polls it); a thread notes when each peer logs
    that it is online, to tell the peers' start-up from the poll's lag."""
    began = time.monotonic()
    peers = swarm.start_bootstrap()
    bootstrap_s = time.monotonic() - began
    procs = [swarm.start_peer(DEFAULT_MODEL, layers, name, wait=False) for name, layers in PEERS.items()]
    online: dict[str, float] = {}
    watcher = threading.Thread(target=watch_online, args=(procs, online, began), daemon=True)
    watcher.start()
    status = [
        sys.executable,
        "-m",
        "hexswarm.swarm.commands.cli",
        "status",
        "--initial-peers",
        *peers,
        "--model",
        DEFAULT_MODEL,
    ]
    env = {**os.environ, **COLOCATED_ENV}
    calls = []  # (started, seconds) of each status call, since `began`
    while True:
        called = time.monotonic()
        # no pipes: the status's p2pd daemon may hold them open for a second or two after it exits
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, env=env)
        covered = subprocess.run(status, **quiet).returncode == 0
        calls.append((round(called - began, 2), round(time.monotonic() - called, 2)))
        if covered:
            break
        if time.monotonic() - began > 300:
            raise RuntimeError("the swarm did not come up within 300 s")
        time.sleep(1)
    swarm_start_s = time.monotonic() - began
    watcher.join(timeout=5)
    return {
        "swarm_start_s": round(swarm_start_s, 2),
        "bootstrap_s": round(bootstrap_s, 2),
        "peers_online_s": round(max(online.values(), default=float("nan")), 2),
        "status_calls": calls,
    }


def watch_online(procs, online: dict[str, float], began: float) -> None:
    deadline = began + 300
    while len(online) < len(procs) and time.monotonic() < deadline:
        for proc in procs:
            if proc.name not in online and "online:" in proc.log():
                online[proc.name] = time.monotonic() - began
        time.sleep(0.05)


def swarm_figures(swarm: LocalSwarm, short: torch.Tensor, long: torch.Tensor, local_out, args) -> dict:
    from hexswarm.client import DistributedModelForCausalLM

    model = DistributedModelForCausalLM.from_pretrained(DEFAULT_MODEL, initial_peers=swarm.initial_peers)
    try:
        out, ms = decode_ms(model, short, args.new_tokens, args.repeats)
        figures = {
            "ms_per_token": round(ms, 2),
            "ttft_ms": round(ttft_ms(model, long, args.repeats), 1),
            "exact": bool(torch.equal(out, local_out)),
            "chain": model.last_route,
        }
        figures["tok_s_1_client"] = round(aggregate_tok_s(model, short, 1, args.new_tokens), 1)
        figures["tok_s_4_clients"] = round(aggregate_tok_s(model, short, 4, args.new_tokens), 1)
        return figures
    finally:
        model.shutdown()


def aggregate_tok_s(model, input_ids: torch.Tensor, clients: int, new_tokens: int) -> float:
    """All new tokens over the wall time of `clients` generate() calls running at once (threads,
    each with its own swarm session, as the API server runs them)."""

    def one(_):
        model.generate(input_ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)

    one(None)  # warm-up
    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(clients)))
    return clients * new_tokens / (time.perf_counter() - began)


if __name__ == "__main__":
    main()
