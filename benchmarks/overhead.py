"""Swarm overhead: ms per generated token through two local peers vs. the same model in one process.

Prints one JSON line. For each model size: local and swarm ms per token (greedy decode, after
the first token), their ratio, time to first token, and whether the outputs were equal.
Everything runs on this machine (127.0.0.1), so the ratio is the cost of hexswarm itself:
framing, p2p streams, process hops. The swarm figures are the client relaying every hop
(`push=False`); the `push_*` fields are the same swarm and client with peers pushing to each
other (peer/push.py, the client's default), runs of the two modes alternating. Run:

    python benchmarks/overhead.py [--new-tokens 32] [--repeats 3] [--peers 2] [--save [NAME]]

(--save: also write the line to benchmarks/results/overhead.json, or NAME.json)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

# Before torch loads: local baseline, client and peers share this machine's cores (see swarm.tools.launcher).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from bench_results import save, stamp

from hexswarm.swarm.commands.tiny_model import make_tiny_model
from hexswarm.swarm.tools.launcher import LocalSwarm

SIZES = {
    "tiny": dict(hidden=256, layers=8, heads=8, kv_heads=4),
    "medium": dict(hidden=1024, layers=16, heads=16, kv_heads=8),
}
PROMPT_TOKENS = 16


def time_generation(model, input_ids, new_tokens: int, repeats: int) -> tuple[float, float, torch.Tensor]:
    """(median ms per token after the first, median ms to first token, output)."""
    per_token, first = [], []
    output = None
    for _ in range(repeats):
        began = time.perf_counter()
        model.generate(input_ids, max_new_tokens=1, do_sample=False)
        ttft = time.perf_counter() - began
        began = time.perf_counter()
        output = model.generate(input_ids, max_new_tokens=new_tokens, do_sample=False)
        total = time.perf_counter() - began
        first.append(1000 * ttft)
        per_token.append(1000 * (total - ttft) / (new_tokens - 1))
    return statistics.median(per_token), statistics.median(first), output


def time_modes(remote, input_ids, new_tokens: int, repeats: int) -> dict:
    """push -> (ms per token, ttft ms, output) on one swarm client, and the median of the
    per-repeat push/relay ratios ("paired"): the modes' runs alternate, so a slow spell of the
    machine hits both (in turns, each mode first), and pairing takes out most of the drift
    between repeats."""
    runs: dict[bool, list] = {False: [], True: []}
    for repeat in range(repeats):
        for push in (False, True) if repeat % 2 == 0 else (True, False):  # neither mode always goes first
            remote.push = push
            runs[push].append(time_generation(remote, input_ids, new_tokens, 1))
    modes: dict = {
        push: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs), rs[-1][2])
        for push, rs in runs.items()
    }
    modes["paired"] = statistics.median(p[0] / r[0] for p, r in zip(runs[True], runs[False], strict=True))
    return modes


def bench_size(
    name: str, shape: dict, workdir: Path, new_tokens: int, repeats: int, n_peers: int = 2
) -> dict:
    from transformers import AutoModelForCausalLM

    from hexswarm.client import DistributedModelForCausalLM

    model_dir = make_tiny_model(workdir / name, seed=0, **shape)
    input_ids = torch.randint(3, 400, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    local = AutoModelForCausalLM.from_pretrained(model_dir)
    local_ms, local_ttft, local_out = time_generation(local, input_ids, new_tokens, repeats)
    del local

    cuts = [round(i * shape["layers"] / n_peers) for i in range(n_peers + 1)]
    with LocalSwarm(workdir / f"{name}-logs", env={"HEXSWARM_CACHE_DIR": str(workdir / "cache")}) as swarm:
        swarm.start_bootstrap()
        peers = [
            swarm.start_peer(model_dir, f"{a}:{b}", f"{name}-{i}", wait=False)
            for i, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False))
        ]
        for proc in peers:
            swarm.wait_for_log(proc, "online:", timeout=300)
        remote = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.initial_peers)
        try:
            modes = time_modes(remote, input_ids, new_tokens, repeats)
            route = remote.last_route
        finally:
            remote.shutdown()
    (swarm_ms, swarm_ttft, swarm_out), (push_ms, push_ttft, push_out) = modes[False], modes[True]
    return {
        "hidden": shape["hidden"],
        "layers": shape["layers"],
        "local_ms_per_token": round(local_ms, 2),
        "swarm_ms_per_token": round(swarm_ms, 2),
        "ratio": round(swarm_ms / local_ms, 3),
        "local_ttft_ms": round(local_ttft, 1),
        "swarm_ttft_ms": round(swarm_ttft, 1),
        "outputs_equal": bool(torch.equal(local_out, swarm_out)),
        "chain": route,
        "push_ms_per_token": round(push_ms, 2),
        "push_ttft_ms": round(push_ttft, 1),
        "push_vs_relay": round(push_ms / swarm_ms, 3),
        "push_vs_relay_paired": round(modes["paired"], 3),
        "push_outputs_equal": bool(torch.equal(local_out, push_out)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument(
        "--peers", type=int, default=2, help="peers the layers are split over (a chain of that many hops)"
    )
    parser.add_argument(
        "--save", nargs="?", const="overhead", metavar="NAME", help="also write benchmarks/results/NAME.json"
    )
    args = parser.parse_args()
    started = stamp()
    with tempfile.TemporaryDirectory(prefix="hexswarm-bench-") as tmp:
        result = {
            "bench": "overhead",
            "new_tokens": args.new_tokens,
            "prompt_tokens": PROMPT_TOKENS,
            "torch_threads": torch.get_num_threads(),
            "peers": args.peers,
        }
        for name in args.sizes:
            result[name] = bench_size(name, SIZES[name], Path(tmp), args.new_tokens, args.repeats, args.peers)
    print(json.dumps(result), flush=True)
    if args.save:
        save(args.save, {**result, "started": started, "ended": stamp()})


if __name__ == "__main__":
    main()
