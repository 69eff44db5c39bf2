"""Where the benchmarks save their JSON (benchmarks/results/NAME.json) and how repeats are summarized.

A benchmark run with `--save` writes its JSON line here; `python benchmarks/charts.py` draws
the charts of docs/ from these files, so a rerun of a benchmark and of charts.py redraws them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def save(name: str, result: dict, folder: Path = RESULTS) -> Path:
    """Writes `result` as one JSON line to folder/NAME.json; returns the path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(result) + "\n")
    return path


def _git(*args: str) -> str:
    """What `git ARGS` prints in the checkout holding the results folder."""
    root = RESULTS.parent.parent
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    return done.stdout.strip()


def stamp() -> dict:
    """When and on what a run happened, for a saved result: the UTC time, the checkout's commit
    (with "+dirty" when its tracked files differ from it) and the 1/5/15-minute load average."""
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", ""
    return {
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": (commit or "unknown") + ("+dirty" if dirty else ""),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


def summarize(bench: str, argv: list[str], lines: list[dict], started: dict, save_it: bool) -> dict:
    """The run's summary line (its command, per-N lines and stamps), printed, and saved as
    results/BENCH.json when `save_it`."""
    summary = {
        "bench": bench,
        "command": " ".join(argv),
        "lines": lines,
        "started": started,
        "ended": stamp(),
    }
    print(json.dumps(summary), flush=True)
    if save_it:
        save(bench, summary)
    return summary


def load(name: str, folder: Path = RESULTS) -> dict | None:
    """The last saved result of benchmark NAME, or None if it was never saved."""
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def spread(values: list[float], digits: int = 3) -> dict:
    """Median, min and max of repeated measurements (and how many), rounded."""
    if not values:
        raise ValueError("no values to summarize")
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "n": len(values),
    }
