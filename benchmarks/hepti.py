"""Hepti's uneven split on CPU: one peer serving every layer of SmolLM2-135M-Instruct as a
tensor-parallel group of CPU ranks, one of them made slower.

Per case (a number of ranks), one JSON line:

- `ms_even`: ms per generated token with `--partition even` (1/K of every layer each), the
  last rank computing `factor` times slower from the start;
- `ms_lp` (= `ms_fresh_lp`): the same with `--partition auto`: the ranks are profiled at start
  (the slow one included) and Hepti's LP sizes their shares;
- `ms_repartitioned`: `--partition auto` with every rank at full speed at start, the last rank
  slowed `factor` times `--onset` seconds after its first step; the group notices from the
  observed step times, re-solves and switches; ms per token once it has;
- `recovery_s`: from the slowdown until the rolling ms per token stays within 10% of
  `ms_fresh_lp`; `sessions_lost`: generations that failed; `exact`: every output equals the
  first even run's;
- `predicted_error`: |the LP's predicted step - the group's observed decode step| / observed, from
  the `--partition auto` peer's record (both cover every layer, network excluded; the prediction
  is at the speeds the group last observed); `predicted_at_start_ms`: the prediction from the
  profiles alone, before any step.

The slowdown is benchmark-only (`run-peer --debug-slowdown RANK:FACTOR[@SECONDS]`): after each
stretch of its compute the rank sleeps FACTOR - 1 times as long, so it is that much slower
without taking a core from the others (this machine has 2). Run:

    python benchmarks/hepti.py [--ranks 3] [--factor 2] [--new-tokens 24] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

# Before torch loads: the client and the peer's ranks share this machine's cores (see swarm.launcher).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import StoppingCriteria  # noqa: E402

from hexswarm.swarm.builtin_models import DEFAULT_MODEL  # noqa: E402
from hexswarm.swarm.launcher import LocalSwarm  # noqa: E402
from hexswarm.swarm.records import read_peer_records  # noqa: E402

PROMPT = [1, 504, 3458, 282, 260, 3108, 30, 2683, 314, 253, 1345, 28]  # a short fixed prompt
EXTRA: tuple[str, ...] = ()  # more run-peer flags (a diagnosis: "-v")
SKIP_MEASURING = ("--throughput", "100", "--decode-ms", "1")  # one peer: its announced speed routes nothing


class TokenTimes(StoppingCriteria):
    """Notes when each token is generated (never stops generation)."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores, **kwargs) -> bool:
        self.times.append(time.perf_counter())
        return False


def start_group(swarm: LocalSwarm, ranks: int, partition: str, slowdown: str):
    return swarm.start_peer(
        DEFAULT_MODEL, "0:30", f"{partition}{ranks}", "--tp", str(ranks), "--devices", ",".join(["cpu"] * ranks),
        "--partition", partition, "--debug-slowdown", slowdown, "--announce-period", "1", *SKIP_MEASURING, *EXTRA,
        timeout=600,
    )  # fmt: skip


def client(swarm: LocalSwarm):
    from hexswarm.client import DistributedModelForCausalLM

    return DistributedModelForCausalLM.from_pretrained(DEFAULT_MODEL, initial_peers=swarm.initial_peers)


def generate(model, new_tokens: int) -> tuple[torch.Tensor, list[float]]:
    """Greedy output and the seconds between consecutive tokens after the first."""
    clock = TokenTimes()
    output = model.generate(
        torch.tensor([PROMPT]), max_new_tokens=new_tokens, do_sample=False, stopping_criteria=[clock]
    )
    return output, [b - a for a, b in zip(clock.times, clock.times[1:], strict=False)]


def record_of(model):
    records = read_peer_records(model.swarm.dht, model.spec.model_id)
    return records[0] if records else None


def steady(swarm: LocalSwarm, ranks: int, partition: str, slowdown: str, args) -> dict:
    """ms per token of a group whose speeds do not change while it serves."""
    peer = start_group(swarm, ranks, partition, slowdown)
    model = client(swarm)
    try:
        generate(model, 4)  # warm-up
        runs = [generate(model, args.new_tokens) for _ in range(args.repeats)]
        time.sleep(1.5)  # the record's observed step is refreshed every announce
        record = record_of(model)
    finally:
        model.shutdown()
        swarm.stop(peer)
    predicted = re.search(r"predicted ([0-9.]+) ms a step", peer.log())
    return {
        "ms": statistics.median(1000 * statistics.mean(gaps) for _, gaps in runs),
        "outputs": [out for out, _ in runs],
        "record": record,
        "predicted_at_start_ms": float(predicted.group(1)) if predicted else None,
    }


def mid_run(swarm: LocalSwarm, ranks: int, slowdown: str, fresh_ms: float, args) -> dict:
    """A group at full speed whose last rank slows down `args.onset` s after its first step."""
    peer = start_group(swarm, ranks, "auto", f"{slowdown}@{args.onset}")
    model = client(swarm)
    gaps: list[tuple[float, float]] = []  # (when, seconds since the previous token)
    outputs, lost, began, switched = [], 0, time.perf_counter(), None
    try:
        while time.perf_counter() - began < args.onset + args.deadline:
            try:
                output, run_gaps = generate(model, args.new_tokens)
            except Exception:  # a failed generation is a lost session: counted, not fatal
                lost += 1
                continue
            now = time.perf_counter()
            outputs.append(output)
            gaps += [(now, g) for g in run_gaps]
            record = record_of(model)
            if switched is None and record is not None and record.tp_repartitions:
                switched = now
            if switched is not None and now - switched > args.after_switch_s:
                break
    finally:
        model.shutdown()
        swarm.stop(peer)
    onset = began + args.onset
    after = [g for t, g in gaps if switched is not None and t > switched]
    return {
        "ms": 1000 * statistics.median(after) if after else None,
        "recovery_s": recovery_s(gaps, onset, fresh_ms),
        "switched_s": round(switched - onset, 1) if switched else None,
        "outputs": outputs,
        "lost": lost,
    }


def recovery_s(
    gaps: list[tuple[float, float]], onset: float, fresh_ms: float, window: int = 8
) -> float | None:
    """Seconds from `onset` until the rolling median token gap stays within 10% of `fresh_ms`."""
    later = [(t, g) for t, g in gaps if t >= onset]
    recovered = None
    for k in range(len(later) - window + 1):
        ok = 1000 * statistics.median(g for _, g in later[k : k + window]) <= 1.1 * fresh_ms
        if ok and recovered is None:
            recovered = later[k][0]
        elif not ok:
            recovered = None
    return round(recovered - onset, 1) if recovered is not None else None


def run_case(swarm: LocalSwarm, ranks: int, args) -> dict:
    slowdown = f"{ranks - 1}:{args.factor}"
    even = steady(swarm, ranks, "even", slowdown, args)
    lp = steady(swarm, ranks, "auto", slowdown, args)
    moved = mid_run(swarm, ranks, slowdown, lp["ms"], args)
    record = lp["record"]
    reference = even["outputs"][0]
    outputs = even["outputs"] + lp["outputs"] + moved["outputs"]
    predicted, observed = record.tp_predicted_step_ms, record.tp_observed_step_ms
    return {
        "case": f"{ranks}-cpu-ranks-one-{args.factor:g}x-slower",
        "ms_even": round(even["ms"], 1),
        "ms_lp": round(lp["ms"], 1),
        "ms_repartitioned": round(moved["ms"], 1) if moved["ms"] else None,
        "ms_fresh_lp": round(lp["ms"], 1),
        "recovery_s": moved["recovery_s"],
        "sessions_lost": moved["lost"],
        "predicted_error": round(abs(predicted - observed) / observed, 3) if observed else None,
        "lp_vs_even": round(even["ms"] / lp["ms"], 3),
        "exact": all(torch.equal(reference, out) for out in outputs),
        "lp_shares": [list(share) for share in record.tp_shares],
        "lp_mode": record.tp_partition,
        "predicted_step_ms": round(predicted, 1),
        "predicted_at_start_ms": lp["predicted_at_start_ms"],
        "observed_step_ms": round(observed, 1),
        "switched_s": moved["switched_s"],
        "new_tokens": args.new_tokens,
        "cpu_cores": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[3])
    parser.add_argument("--factor", type=float, default=2.0, help="how much slower the last rank computes")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--onset", type=float, default=8.0, help="seconds of serving before the slowdown")
    parser.add_argument("--deadline", type=float, default=90.0, help="seconds after it to wait for a switch")
    parser.add_argument(
        "--after-switch-s", type=float, default=20.0, help="seconds measured after the switch"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hexswarm-bench-hepti-") as tmp:
        with LocalSwarm(Path(tmp) / "logs") as swarm:
            swarm.start_bootstrap()
            for ranks in args.ranks:
                print(json.dumps(run_case(swarm, ranks, args)), flush=True)


if __name__ == "__main__":
    main()
