"""What a tensor-parallel peer's move costs on this CPU: loading time, and serving while it loads.

A TP group of two CPU ranks (`cpu,cpu`, gloo, the cores split between them) serves the first half
of the medium model at TP 2, the way `run-peer --layers auto --tp auto` starts. It then moves
make-before-break as a plan tells it to (peer/range_move.py): it loads the second half beside
the first, once at TP 2 (a range move) and once at TP 1 (a change of degree), while one session
keeps decoding on the serving stack. Prints one JSON line, per move: the load's wall time, the
serving session's decode step (median and max ms) before and during the load and their ratio,
and the decode step on the new stack. The checkpoint was just written, so its file is in the page
cache: the loads show what building and slicing the layers costs, not a disk read. Run:

    python benchmarks/tp_move.py [--steps 40] [--save]

(--save: also write the line to benchmarks/results/tp_move.json)
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
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (see swarm/tools/threads.py)

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_results import save, stamp  # noqa: E402
from overhead import SIZES  # noqa: E402  (the same model shapes as the overhead benchmark)

from hexswarm.peer.tp.group import TPGroup  # noqa: E402
from hexswarm.swarm.commands.tiny_model import make_tiny_model  # noqa: E402
from hexswarm.swarm.models.model_spec import load_model_spec  # noqa: E402

CPU = torch.device("cpu")
PREFILL_TOKENS = 16


class Session:
    """One decoding session on a stack: a prefill, then one step per `step()`."""

    def __init__(self, blocks, name: str, hidden_size: int):
        self.blocks, self.name = blocks, name
        self.cache = blocks.new_cache(name)
        self.position = PREFILL_TOKENS
        self.hidden_size = hidden_size
        blocks(torch.randn(1, PREFILL_TOKENS, hidden_size), self.cache, 0, blocks.start, blocks.end)

    def step(self) -> float:
        """Wall ms of one decode step."""
        token = torch.randn(1, 1, self.hidden_size)
        began = time.perf_counter()
        self.blocks(token, self.cache, self.position, self.blocks.start, self.blocks.end)
        self.position += 1
        return 1000 * (time.perf_counter() - began)

    def close(self) -> None:
        self.blocks.release(self.name)


def figures(ms: list[float]) -> dict:
    return {"median_ms": round(statistics.median(ms), 2), "max_ms": round(max(ms), 2), "steps": len(ms)}


def bench_move(group: TPGroup, serving, tp: int, steps: int, hidden: int, half: int) -> dict:
    """Loads [half, 2*half) at degree `tp` while a session decodes on `serving`."""
    session = Session(serving, f"serving-tp{tp}", hidden)
    before = [session.step() for _ in range(steps)]
    loaded, during = {}, []

    def load() -> None:
        began = time.perf_counter()
        loaded["blocks"] = group.load_stack(half, 2 * half, tp)
        loaded["seconds"] = time.perf_counter() - began

    loader = threading.Thread(target=load)
    loader.start()
    while loader.is_alive():
        during.append(session.step())
    loader.join()
    session.close()
    new = loaded["blocks"]
    moved = Session(new, f"moved-tp{tp}", hidden)
    after = [moved.step() for _ in range(steps)]
    moved.close()
    group.drop_stack(new)
    before_f, during_f = figures(before), figures(during or before)
    return {
        "load_s": round(loaded["seconds"], 2),
        "serving_before": before_f,
        "serving_during_load": during_f,
        "during_over_before_median": round(during_f["median_ms"] / before_f["median_ms"], 2),
        "new_stack": figures(after),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="medium", choices=list(SIZES))
    parser.add_argument(
        "--steps", type=int, default=40, help="decode steps timed before the load and after it"
    )
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/tp_move.json")
    args = parser.parse_args()
    started = stamp()
    shape = SIZES[args.size]
    half = shape["layers"] // 2
    with tempfile.TemporaryDirectory(prefix="hexswarm-bench-") as tmp:
        spec = load_model_spec(make_tiny_model(tmp, **shape))
        failures: list[str] = []
        group = TPGroup(spec, 0, half, torch.float32, (CPU, CPU), 60.0, failures.append, degrees=(1, 2))
        try:
            with torch.inference_mode():
                serving = group.launch()
                moves = {
                    f"tp2_to_tp{tp}": bench_move(group, serving, tp, args.steps, shape["hidden"], half)
                    for tp in (2, 1)
                }
        finally:
            group.stop()
    result = {
        "bench": "tp_move",
        "model": args.size,
        "layers_moved": half,
        "ranks": 2,
        "moves": moves,
        "group_failed": bool(failures),
    }
    print(json.dumps(result))
    if args.save:
        save("tp_move", {**result, "started": started, "ended": stamp()})


if __name__ == "__main__":
    main()
