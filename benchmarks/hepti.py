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
- `predicted_error`: |the LP's predicted step - the group's observed decode step| / observed for
  the `--partition auto` group (both over every layer, the network excluded), the prediction
  from the profiles at start (`predicted_at_start_ms`; `predicted_at_observed_speeds_ms` is the
  same split's at the compute speeds the group observed since).

The slowdown is benchmark-only (`run-peer --debug-slowdown RANK:FACTOR[@SECONDS]`): after each
stretch of its compute the rank sleeps FACTOR - 1 times as long, so it is that much slower
without taking a core from the others (this machine has 2). Run:

    python benchmarks/hepti.py [--ranks 3] [--factor 2] [--new-tokens 24] [--repeats 3] [--save]

(--save: also write the lines to benchmarks/results/hepti.json)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Before torch loads: the client and the peer's ranks share this machine's cores (see swarm.tools.launcher).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from bench_results import save  # noqa: E402
from transformers import StoppingCriteria  # noqa: E402

from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL  # noqa: E402
from hexswarm.swarm.tools.launcher import LocalSwarm  # noqa: E402
from hexswarm.swarm.trust.records import read_peer_records  # noqa: E402

PROMPT = [1, 504, 3458, 282, 260, 3108, 30, 2683, 314, 253, 1345, 28]  # a short fixed prompt
EXTRA: tuple[str, ...] = ()  # more run-peer flags (a diagnosis: "-v")
SKIP_MEASURING = ("--throughput", "100", "--decode-ms", "1")  # one peer: its announced speed routes nothing


class TokenTimes(StoppingCriteria):
    """Notes when each token is generated and, with `watch`, when the group's record first shows
    a re-partition (checked every 8 tokens; never stops generation)."""

    def __init__(self, watch=None):
        self.times: list[float] = []
        self.watch, self.switched = watch, None

    def __call__(self, input_ids, scores, **kwargs) -> bool:
        self.times.append(time.perf_counter())
        if self.watch is not None and self.switched is None and len(self.times) % 8 == 0:
            record = record_of(self.watch)
            if record is not None and record.tp_repartitions:
                self.switched = self.times[-1]
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


def generate(
    model, new_tokens: int, watch: bool = False
) -> tuple[torch.Tensor, list[tuple[float, float]], float | None]:
    """Greedy output, (time, seconds since the previous token) of each token after the first, and
    with `watch` when a re-partition was first seen."""
    clock = TokenTimes(model if watch else None)
    output = model.generate(
        torch.tensor([PROMPT]), max_new_tokens=new_tokens, do_sample=False, stopping_criteria=[clock]
    )
    return output, [(b, b - a) for a, b in zip(clock.times, clock.times[1:], strict=False)], clock.switched


def record_of(model):
    records = read_peer_records(model.swarm.dht, model.spec.model_id)
    return records[0] if records else None


def steady(swarm: LocalSwarm, ranks: int, partition: str, slowdown: str, args) -> dict:
    """ms per token of a group whose speeds do not change while it serves."""
    peer = start_group(swarm, ranks, partition, slowdown)
    model = client(swarm)
    try:
        generate(model, 4)  # warm-up
        runs = [generate(model, args.new_tokens)[:2] for _ in range(args.repeats)]
        time.sleep(1.5)  # the record's observed step is refreshed every announce
        record = record_of(model)
    finally:
        model.shutdown()
        swarm.stop(peer)
    predicted = re.search(r"predicted ([0-9.]+) ms a step \(even: ([0-9.]+)?", peer.log())
    profiled = re.search(r"all-reduce ([0-9.]+) us a layer", peer.log())
    speeds = re.search(r"profiled ranks: \[([0-9., ]+)\] GFLOP/s", peer.log())
    return {
        "ms": statistics.median(1000 * statistics.mean(g for _, g in gaps) for _, gaps in runs),
        "outputs": [out for out, _ in runs],
        "record": record,
        "predicted_at_start_ms": float(predicted.group(1)) if predicted else None,
        "predicted_even_ms": float(predicted.group(2)) if predicted and predicted.group(2) else None,
        "all_reduce_us": float(profiled.group(1)) if profiled else None,
        "gflops": [float(x) for x in speeds.group(1).split(",")] if speeds else None,
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
                output, run_gaps, seen = generate(model, args.new_tokens, watch=switched is None)
            except Exception as e:  # a failed generation is a lost session: counted, not fatal
                print(f"lost a session: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                lost += 1
                continue
            outputs.append(output)
            gaps += run_gaps
            switched = switched or seen
            if switched is not None and time.perf_counter() - switched > args.after_switch_s:
                break
    finally:
        model.shutdown()
        swarm.stop(peer)
    onset = began + args.onset
    after = [g for t, g in gaps if switched is not None and t > switched]
    slowed = [g for t, g in gaps if onset + 1 < t < (switched or math.inf)]
    return {
        "ms": 1000 * statistics.median(after) if after else None,
        "ms_slowed_before_switch": 1000 * statistics.median(slowed) if slowed else None,
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


def modelled_gain(gflops: list[float], all_reduce_s: float) -> float | None:
    """even ÷ LP step as Hepti's model predicts it for ranks of these speeds, with every
    all-reduce costing `all_reduce_s` (None when no even split exists)."""
    from hexswarm.peer.tp.partition import RankProfile, hepti_problem, layer_shape
    from hexswarm.routing.hepti.split import plan_split
    from hexswarm.swarm.models.model_spec import load_model_spec

    config = load_model_spec(DEFAULT_MODEL).config.to_dict()
    link = all_reduce_s / (2 * (len(gflops) - 1))  # Eq. 6: two latencies per rank besides the leader
    profiles = [RankProfile(g * 1e9, 1e12, link if i else 0.0, math.inf) for i, g in enumerate(gflops)]
    split = plan_split(hepti_problem(layer_shape(config, 30, 4), profiles))
    return (
        round(split.even_step_time_s / split.step_time_s, 3)
        if math.isfinite(split.even_step_time_s)
        else None
    )


def run_case(swarm: LocalSwarm, ranks: int, args) -> dict:
    slowdown = f"{ranks - 1}:{args.factor}"
    # SmolLM2's 9 heads and 3 KV heads split evenly over 1 or 3 ranks only
    even = steady(swarm, ranks, "even", slowdown, args) if 3 % ranks == 0 else {"ms": None, "outputs": []}
    lp = steady(swarm, ranks, "auto", slowdown, args)
    moved = mid_run(swarm, ranks, slowdown, lp["ms"], args)
    record = lp["record"]
    outputs = even["outputs"] + lp["outputs"] + moved["outputs"]
    reference = outputs[0]
    predicted, observed = record.tp_predicted_step_ms, record.tp_observed_step_ms
    at_start = lp["predicted_at_start_ms"]
    return {
        "case": f"{ranks}-cpu-ranks-one-{args.factor:g}x-slower",
        "ms_even": round(even["ms"], 1) if even["ms"] else None,
        "ms_lp": round(lp["ms"], 1),
        "ms_repartitioned": round(moved["ms"], 1) if moved["ms"] else None,
        "ms_fresh_lp": round(lp["ms"], 1),
        "recovery_s": moved["recovery_s"],
        "sessions_lost": moved["lost"],
        "predicted_error": round(abs(at_start - observed) / observed, 3) if observed and at_start else None,
        "lp_vs_even": round(even["ms"] / lp["ms"], 3) if even["ms"] else None,
        # the split made for equal speeds, once the rank has slowed and before the group re-splits
        "ms_slowed_before_switch": round(moved["ms_slowed_before_switch"], 1)
        if moved["ms_slowed_before_switch"]
        else None,
        "exact": all(torch.equal(reference, out) for out in outputs),
        "lp_shares": [list(share) for share in record.tp_shares],
        "lp_mode": record.tp_partition,
        "predicted_at_start_ms": at_start,
        "predicted_even_ms": lp["predicted_even_ms"],  # the LP's own figure for the even split
        "predicted_at_observed_speeds_ms": round(predicted, 1),
        "observed_step_ms": round(observed, 1),
        # one all-reduce of a hidden state over the group, as profiled at start (2 a layer, 60 a token)
        "all_reduce_us": lp["all_reduce_us"],
        "profiled_gflops": lp["gflops"],
        # what the LP's model predicts for these ranks if an all-reduce cost 20 us (own cores or GPUs)
        "modelled_lp_vs_even_20us": modelled_gain(lp["gflops"], 20e-6) if lp["gflops"] else None,
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
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/hepti.json")
    args = parser.parse_args()
    lines = []
    with tempfile.TemporaryDirectory(prefix="hexswarm-bench-hepti-") as tmp:
        with LocalSwarm(Path(tmp) / "logs") as swarm:
            swarm.start_bootstrap()
            for ranks in args.ranks:
                lines.append(run_case(swarm, ranks, args))
                print(json.dumps(lines[-1]), flush=True)
    if args.save:
        save("hepti", {"bench": "hepti", "lines": lines})


if __name__ == "__main__":
    main()
