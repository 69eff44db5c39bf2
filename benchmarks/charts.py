"""Draws the charts of docs/benchmarks.md from the JSON the benchmarks saved (bench_results.py).

    python benchmarks/charts.py          # every chart whose benchmark saved a result; ~5 s

| chart | from | rerun the benchmark with |
|---|---|---|
| docs/bench-petals.png | results/petals_side_by_side.json | python benchmarks/petals_side_by_side.py --save |
| docs/bench-churn.png | results/churn.json | python benchmarks/churn.py --seed 0 --save |
| docs/bench-router.png | results/router.json | python benchmarks/router.py --json --sizes 100,500 --fronts-only --save |

The data extraction (`*_series`) is plain Python and tested; matplotlib is imported only to
draw (`pip install -e .[bench]`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench_results import RESULTS, load

DOCS = Path(__file__).resolve().parents[1] / "docs"
METRICS = (  # side by side: (key in a comparison row, axis label)
    ("decode_ms", "decode ms/token (lower is better)"),
    ("ttft_ms", "time to first token, ms (lower is better)"),
    ("aggregate_tokens_per_s", "aggregate tokens/s (higher is better)"),
)
SYSTEMS = ("Petals 2.2.0", "hexswarm")  # the order of the pairs in a comparison row
MODEL_NAMES = {  # in drawing order: the real model first
    "smollm2": "SmolLM2-135M-Instruct",
    "tiny": "tiny random Llama (256 × 8)",
    "big": "random Llama (1024 × 16)",
}
CHURN_POLICIES = {  # policy key -> legend, in drawing order (the fair baseline right after ours)
    "coordinator": "hexswarm's coordinator (a peer per 4 GPUs)",
    "petals-4gpu": "Petals' rule, a TP server per 4 GPUs (deployed alike)",
    "petals": "Petals' rule, a TP server per machine",
    "petals-gpu": "Petals' rule, a server per GPU",
}


def side_by_side_series(result: dict) -> dict:
    """model -> metric -> system -> (clients, values), from petals_side_by_side's line."""
    series = {}
    order = [
        *(m for m in MODEL_NAMES if m in result["models"]),
        *(m for m in result["models"] if m not in MODEL_NAMES),
    ]
    for model in order:
        rows = sorted(result["models"][model]["by_clients"], key=lambda row: row["clients"])
        clients = [row["clients"] for row in rows]
        series[model] = {
            metric: {system: (clients, [row[metric][i] for row in rows]) for i, system in enumerate(SYSTEMS)}
            for metric, _ in METRICS
        }
    return series


def rolling_mean(values: list[float | None], width: int) -> list[float | None]:
    """Centered mean over `width` samples, skipping None (None where a window holds none)."""
    half, out = width // 2, []
    for i in range(len(values)):
        window = [v for v in values[max(0, i - half) : i + half + 1] if v is not None]
        out.append(sum(window) / len(window) if window else None)
    return out


def churn_series(result: dict, width: int = 5) -> dict:
    """policy -> (minutes, attainment (rolling mean of `width` samples), coverage), from churn's line;
    coverage is the share of the swarm's GPUs in complete chains."""
    present = result["gpus_present"]
    series = {}
    for policy, row in result["policies"].items():
        line = row["timeline"]
        coverage = [
            round(g / p, 3) if p else None for g, p in zip(line["gpus_in_chains"], present, strict=True)
        ]
        series[policy] = (line["minute"], rolling_mean(line["attainment"], width), coverage)
    return series


def front_series(result: dict, seed: int = 0) -> dict:
    """peers -> {"ours": points, "sweep": points, "min_latency_ms": x} for one seed, from router's rows."""
    return {
        row["peers"]: row["front_points"]
        for row in result["rows"]
        if row["seed"] == seed and "front_points" in row
    }


def draw_side_by_side(result: dict, path: Path) -> None:
    plt = _pyplot()
    series = side_by_side_series(result)
    fig, axes = plt.subplots(len(series), len(METRICS), figsize=(13, 3.6 * len(series)), squeeze=False)
    for r, (model, metrics) in enumerate(series.items()):
        for c, (metric, label) in enumerate(METRICS):
            ax = axes[r][c]
            for system, color in zip(SYSTEMS, ("tab:gray", "tab:blue"), strict=True):
                clients, values = metrics[metric][system]
                ax.plot(clients, values, marker="o", color=color, label=system)
            ax.set_xscale("log", base=2)
            ax.set_xticks(clients, [str(n) for n in clients])
            ax.set_xlabel("concurrent clients")
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
            ax.set_title(MODEL_NAMES.get(model, model), fontsize=10)
            ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("hexswarm and Petals 2.2.0, same machine (2 CPU cores), checkpoints and workload: 2 peers")
    _save(fig, path)


def draw_churn(result: dict, path: Path) -> None:
    plt = _pyplot()
    series = churn_series(result)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True)
    for policy, label in CHURN_POLICIES.items():
        if policy not in series:
            continue
        minutes, attainment, coverage = series[policy]
        width = 2.2 if policy == "coordinator" else 1.2
        top.plot(minutes, attainment, label=label, linewidth=width)
        bottom.plot(minutes, coverage, label=label, linewidth=width)
    top.set_ylabel("SLO attainment\n(mean of 5 samples, 2.5 min)")
    bottom.set_ylabel("coverage: share of the\nswarm's GPUs in chains")
    bottom.set_xlabel("minute (simulated)")
    for ax in (top, bottom):
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    top.legend(fontsize=8, loc="lower left")
    fig.suptitle(
        f"An hour of churn, {result['gpus']} GPUs (seed {result['seed']}, {result['joins']} joins, "
        f"{result['leaves']} leaves; simulated)"
    )
    _save(fig, path)


def draw_router(result: dict, path: Path) -> None:
    plt = _pyplot()
    fronts = front_series(result)
    fig, axes = plt.subplots(1, len(fronts), figsize=(6 * len(fronts), 4.5), squeeze=False)
    for ax, (peers, front) in zip(axes[0], sorted(fronts.items()), strict=True):
        for key, label, style in (
            ("sweep", "ε-constraint sweep (reference)", dict(marker="s", color="tab:gray", alpha=0.6)),
            ("ours", "NSGA-II front (the tradeoff router's)", dict(marker="o", color="tab:blue")),
        ):
            latency, throughput = zip(*front[key], strict=True) if front[key] else ((), ())
            ax.step(latency, throughput, where="post", label=label, **style)
        ax.axvline(front["min_latency_ms"], color="tab:red", linestyle="--", label="exact min-latency chain")
        ax.set_xlabel("chain latency, ms per decode step (sum of hops)")
        ax.set_ylabel("chain throughput, tokens/s (slowest hop)")
        ax.set_title(f"{peers} peers, 80 blocks (seed 0)", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("The router's latency/throughput front (synthetic swarms)")
    _save(fig, path)


CHARTS = (  # (saved result, drawing, file in docs/)
    ("petals_side_by_side", draw_side_by_side, "bench-petals.png"),
    ("churn", draw_churn, "bench-churn.png"),
    ("router", draw_router, "bench-router.png"),
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: reruns differ only in data
    _pyplot().close(fig)


def main() -> int:
    drawn = 0
    for name, draw, file in CHARTS:
        result = load(name)
        if result is None:
            print(
                f"skipped {file}: no {RESULTS / name}.json (run the benchmark with --save)", file=sys.stderr
            )
            continue
        draw(result, DOCS / file)
        print(f"drew docs/{file} from {RESULTS.name}/{name}.json", file=sys.stderr)
        drawn += 1
    return 0 if drawn else 1


if __name__ == "__main__":
    sys.exit(main())
