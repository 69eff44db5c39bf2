"""Tensor parallelism on CPU: one peer serving every layer of the medium model at TP 1 and TP 2.

Prints one JSON line: for each degree, ms per generated token (greedy, after the first token)
and time to first token, through a bootstrap and that one peer on this machine, with the same
prompt; and whether TP 2 generated the same tokens as TP 1. TP 2 runs two gloo ranks on the
CPU, each with half the cores (`--devices cpu,cpu`). Run:

    python benchmarks/tp.py [--new-tokens 32] [--repeats 3] [--save]

(--save: also write the line to benchmarks/results/tp.json)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

# Before torch loads: the client and the peer's ranks share this machine's cores (see swarm.tools.launcher).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import save, stamp  # noqa: E402
from overhead import PROMPT_TOKENS, SIZES, time_generation  # noqa: E402

from hexswarm.swarm.commands.tiny_model import make_tiny_model  # noqa: E402
from hexswarm.swarm.tools.launcher import LocalSwarm  # noqa: E402
from hexswarm.swarm.trust.records import read_peer_records  # noqa: E402

DEGREES = (1, 2)


def bench_degree(
    swarm: LocalSwarm, model_dir: Path, tp: int, input_ids, new_tokens: int, repeats: int
) -> dict:
    from hexswarm.client import DistributedModelForCausalLM

    layers = SIZES["medium"]["layers"]
    peer = swarm.start_peer(model_dir, f"0:{layers}", f"tp{tp}", "--tp", str(tp), timeout=600)
    try:
        model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=swarm.initial_peers)
        try:
            ms, ttft, output = time_generation(model, input_ids, new_tokens, repeats)
            route = model.last_route
            (record,) = read_peer_records(model.swarm.dht, model.spec.model_id)
        finally:
            model.shutdown()
    finally:
        swarm.stop(peer)
    return {
        "ms_per_token": round(ms, 2), "ttft_ms": round(ttft, 1), "chain": route, "output": output,
        # what the peer measured in itself at start (no network): its record's figures
        "peer_decode_ms_per_block": round(record.decode_ms_per_block, 2),
        "peer_prefill_tokens_per_s_per_block": round(record.throughput),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/tp.json")
    args = parser.parse_args()
    started = stamp()
    shape = SIZES["medium"]
    input_ids = torch.randint(3, 400, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    result = {"bench": "tp", "model": "medium", **{k: shape[k] for k in ("hidden", "layers", "heads", "kv_heads")},
              "new_tokens": args.new_tokens, "prompt_tokens": PROMPT_TOKENS, "cpu_cores": os.cpu_count()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="hexswarm-bench-tp-") as tmp:
        model_dir = make_tiny_model(Path(tmp) / "medium", seed=0, **shape)
        env = {"HEXSWARM_CACHE_DIR": str(Path(tmp) / "cache")}
        with LocalSwarm(Path(tmp) / "logs", env=env) as swarm:
            swarm.start_bootstrap()
            runs = {
                tp: bench_degree(swarm, model_dir, tp, input_ids, args.new_tokens, args.repeats)
                for tp in DEGREES
            }
    outputs = [run.pop("output") for run in runs.values()]
    result.update({f"tp{tp}": run for tp, run in runs.items()})
    result["tp2_vs_tp1_ms_per_token"] = round(runs[2]["ms_per_token"] / runs[1]["ms_per_token"], 3)
    result["outputs_equal"] = all(torch.equal(outputs[0], o) for o in outputs[1:])
    print(json.dumps(result), flush=True)
    if args.save:
        save("tp", {**result, "started": started, "ended": stamp()})


if __name__ == "__main__":
    main()
