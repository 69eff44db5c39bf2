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

With `--coordinator`, a `hexswarm coordinator` process plans the auto peers (it starts once they
are online) and each line adds `idle_cpu_coordinator` and `plan_followed_s`: after the kill, from
when a read of the DHT first shows the coordinator's next plan until every live auto peer's
record says it follows it (reads every 0.5 s; auto peers are told by a nudge over p2p,
swarm/coordinator/nudges.py, and re-read the plan every 4th announce period otherwise).

The announce period is run-peer's default (15 s). Run: python benchmarks/swarm_idle.py --peers 12 24
[--coordinator]
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
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import save, stamp, summarize  # noqa: E402

NUM_BLOCKS = 16
BLOCKS_EACH = 4  # --max-blocks: 12 peers hold each block 3 times over, 24 peers 6 times
PROMPT = [[1, 5, 9, 14, 3, 7]]
COVERED_BOUND_S = 180.0  # how long the swarm gets to serve again after the kill
FOLLOW_BOUND_S = 240.0  # how long the coordinator's next plan gets to be published and followed
LOOPBACK = "/ip4/127.0.0.1/tcp/0"


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


def start_coordinator(swarm, model_dir: Path):
    """A `hexswarm coordinator` of the model on the swarm (a private swarm's peers trust it)."""
    args = [sys.executable, "-m", "hexswarm.swarm.commands.cli", "coordinator", "--initial-peers",
            *swarm.initial_peers, "--model", str(model_dir), "--host-maddrs", LOOPBACK]  # fmt: skip
    return swarm.start_command("coordinator", args, ready="coordinator candidate")


def model_id_of(model_dir: Path) -> str:
    from hexswarm.swarm.models.model_spec import load_model_spec

    return load_model_spec(model_dir).model_id


class PlanFollowing(threading.Thread):
    """Reads the DHT every 0.5 s after the kill: seconds from the first read that shows a new
    plan until every one of `live` auto peers' records follows it (None: not within
    FOLLOW_BOUND_S)."""

    def __init__(self, initial_peers: list[str], model_id: str, live: int):
        super().__init__(daemon=True)
        self.initial_peers, self.model_id, self.live = initial_peers, model_id, live
        self.seconds: float | None = None

    def run(self) -> None:
        from hexswarm.swarm.coordinator.records import read_coordination_sync
        from hexswarm.swarm.net.dht import start_dht
        from hexswarm.swarm.trust.records import read_peer_records

        dht = start_dht(self.initial_peers, None, host_maddrs=[LOOPBACK])
        try:
            first = read_coordination_sync(dht, self.model_id).plan
            began, seen = time.monotonic(), None
            while time.monotonic() - began < FOLLOW_BOUND_S:
                plan = read_coordination_sync(dht, self.model_id).plan
                if plan is not None and (first is None or plan.version > first.version):
                    seen = seen or (plan.version, time.monotonic())
                    auto = [r for r in read_peer_records(dht, self.model_id) if r.auto]
                    following = [r for r in auto if r.plan_version >= seen[0]]
                    if len(following) >= self.live:
                        self.seconds = round(time.monotonic() - seen[1], 1)
                        return
                time.sleep(0.5)
        finally:
            dht.shutdown()

    def result(self) -> float | None:
        self.join(FOLLOW_BOUND_S + 60)
        return self.seconds


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
        watched = [*peers, bootstrap] + ([start_coordinator(swarm, model_dir)] if args.coordinator else [])
        time.sleep(args.settle_seconds)  # moves after the last join, and the first plan, settle
        shares = idle_shares([p.popen.pid for p in watched], args.idle_seconds)
        status_s = status_seconds(swarm.initial_peers)
        generate_s, exact = timed_generate(model_dir, swarm.initial_peers, args.new_tokens, expected)
        victims = random.Random(n).sample(peers, n // 4)
        follow = PlanFollowing(swarm.initial_peers, model_id_of(model_dir), n - len(victims))
        if args.coordinator:
            follow.start()
        for proc in victims:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        killed_at, exact_after = time.monotonic(), False
        while not exact_after and time.monotonic() - killed_at < COVERED_BOUND_S:
            try:
                _, exact_after = timed_generate(model_dir, swarm.initial_peers, args.new_tokens, expected)
            except Exception as e:  # blocks not covered yet: the client says so
                print(f"[swarm_idle] not yet: {type(e).__name__}", file=sys.stderr, flush=True)
        covered_s = time.monotonic() - killed_at
        extra = {}
        if args.coordinator:
            extra = {"idle_cpu_coordinator": round(shares[-1], 4), "plan_followed_s": follow.result()}
        return {
            "peers": n,
            "online_s": round(online_s, 1),
            "idle_cpu_per_peer": round(sum(shares[:n]) / n, 4),
            "idle_cpu_bootstrap": round(shares[n], 4),
            **extra,
            "status_s": round(status_s, 2),
            "generate_s": round(generate_s, 2),
            "exact": exact,
            "killed": len(victims),
            "covered_s": round(covered_s, 1),
            "exact_after": exact_after,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[12, 24])
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--settle-seconds", type=float, default=30.0)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--coordinator", action="store_true", help="a coordinator plans the auto peers")
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/swarm_idle.json")
    parser.add_argument(
        "--save-as", default="swarm_idle", help="--save's file name under benchmarks/results/"
    )
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
    summary = summarize("swarm_idle", sys.argv, lines, started, save_it=False)
    if args.save:
        save(args.save_as, summary)


if __name__ == "__main__":
    main()
