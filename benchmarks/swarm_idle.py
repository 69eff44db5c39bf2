"""N real `run-peer --layers auto --max-blocks 4` processes of a tiny 16-block model on one
bootstrap: what the swarm's upkeep costs each peer while it idles, and how the swarm takes a
quarter of its peers dying at once (issue 50's real-process check, beside the stand-ins of
benchmarks/scale.py).

Everything on 127.0.0.1 (no namespaces), every process of the swarm counted. Per N one JSON line:
- `online_s`: from the first peer's start until every peer said "online:";
- `idle_cpu_per_peer`: over `--idle-seconds` with nobody generating, the mean over peers of the
  CPU its whole process tree used (the peer, its DHT child, p2pd), as a share of one core;
  `idle_cpu_bootstrap` likewise for the bootstrap;
- `status_s`: `hexswarm status --json` (pings included);
- `generate_s` and `exact`: a fresh client (connect included) generating `--new-tokens` greedily,
  against the same model's local `generate()`;
- `killed`, `covered_s`, `exact_after`: a quarter of the peers SIGKILLed at once, then the time
  until a fresh client's generation is exact again (the peers left must cover every block).

The announce period is run-peer's default (15 s). Run: python benchmarks/swarm_idle.py --peers 12 24
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import save, stamp  # noqa: E402

NUM_BLOCKS = 16
BLOCKS_EACH = 4  # --max-blocks: 12 peers hold each block 3 times over, 24 peers 6 times
PROMPT = [[1, 5, 9, 14, 3, 7]]
COVERED_BOUND_S = 180.0  # how long the swarm gets to serve again after the kill


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by `pid` and every process below it."""
    from hexswarm.swarm.net.dht_process import child_pids

    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        stack.extend(child_pids(current))
    return total


def idle_shares(pids: list[int], seconds: float) -> list[float]:
    """Each process tree's CPU over `seconds`, as a share of one core."""
    before = [tree_cpu_seconds(pid) for pid in pids]
    time.sleep(seconds)
    return [(tree_cpu_seconds(pid) - b) / seconds for pid, b in zip(pids, before, strict=True)]


def timed_generate(
    model_dir: Path, initial_peers: list[str], new_tokens: int, expected
) -> tuple[float, bool]:
    """(seconds, exact) of a fresh client's connect and greedy generation."""
    import torch

    from hexswarm.client import DistributedModelForCausalLM

    began = time.monotonic()
    model = DistributedModelForCausalLM.from_pretrained(model_dir, initial_peers=initial_peers)
    try:
        out = model.generate(torch.tensor(PROMPT), max_new_tokens=new_tokens, do_sample=False)
    finally:
        model.shutdown()
    return time.monotonic() - began, bool(torch.equal(out, expected))


def status_seconds(initial_peers: list[str]) -> float:
    began = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hexswarm.swarm.commands.cli",
            "status",
            "--json",
            "--initial-peers",
            *initial_peers,
        ],
        capture_output=True,
        timeout=300,
    )
    return time.monotonic() - began


def measure(n: int, args, model_dir: Path, expected, workdir: Path) -> dict:
    from hexswarm.swarm.tools.launcher import LocalSwarm

    with LocalSwarm(workdir / f"swarm-{n}", env={"HEXSWARM_CACHE_DIR": str(workdir / "cache")}) as swarm:
        swarm.start_bootstrap()
        bootstrap = swarm.processes[-1]
        began = time.monotonic()
        peers = [
            swarm.start_peer(model_dir, "auto", f"auto-{i}", "--max-blocks", str(BLOCKS_EACH), wait=False)
            for i in range(n)
        ]
        for proc in peers:
            swarm.wait_for_log(proc, "online:", 600)
        online_s = time.monotonic() - began
        time.sleep(args.settle_seconds)  # moves after the last join, and the first plan, settle
        shares = idle_shares([p.popen.pid for p in [*peers, bootstrap]], args.idle_seconds)
        status_s = status_seconds(swarm.initial_peers)
        generate_s, exact = timed_generate(model_dir, swarm.initial_peers, args.new_tokens, expected)
        victims = random.Random(n).sample(peers, n // 4)
        for proc in victims:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        killed_at, exact_after = time.monotonic(), False
        while not exact_after and time.monotonic() - killed_at < COVERED_BOUND_S:
            try:
                _, exact_after = timed_generate(model_dir, swarm.initial_peers, args.new_tokens, expected)
            except Exception as e:  # blocks not covered yet: the client says so
                print(f"[swarm_idle] not yet: {type(e).__name__}", file=sys.stderr, flush=True)
        return {
            "peers": n,
            "online_s": round(online_s, 1),
            "idle_cpu_per_peer": round(sum(shares[:-1]) / n, 4),
            "idle_cpu_bootstrap": round(shares[-1], 4),
            "status_s": round(status_s, 2),
            "generate_s": round(generate_s, 2),
            "exact": exact,
            "killed": len(victims),
            "covered_s": round(time.monotonic() - killed_at, 1),
            "exact_after": exact_after,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[12, 24])
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--settle-seconds", type=float, default=30.0)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/swarm_idle.json")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from hexswarm.swarm.commands.tiny_model import make_tiny_model

    started, lines = stamp(), []
    with tempfile.TemporaryDirectory(prefix="hexswarm-idle-") as tmp:
        workdir = Path(tmp)
        model_dir = make_tiny_model(
            workdir / "model", layers=NUM_BLOCKS, hidden=64, heads=4, kv_heads=2, seed=0
        )
        local = AutoModelForCausalLM.from_pretrained(model_dir)
        expected = local.generate(torch.tensor(PROMPT), max_new_tokens=args.new_tokens, do_sample=False)
        for n in args.peers:
            lines.append(measure(n, args, model_dir, expected, workdir))
            print(json.dumps(lines[-1]), flush=True)
    summary = {
        "bench": "swarm_idle",
        "command": " ".join(sys.argv),
        "lines": lines,
        "started": started,
        "ended": stamp(),
    }
    print(json.dumps(summary), flush=True)
    if args.save:
        save("swarm_idle", summary)


if __name__ == "__main__":
    main()
