"""The benchmarks' pure helpers: saved results, per-block figures, the summary of repeats, charts' data."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_results  # noqa: E402
import charts  # noqa: E402
import scale  # noqa: E402


def test_spread_is_the_median_min_and_max_of_the_repeats():
    assert bench_results.spread([1.04, 0.36, 0.52, 0.61, 0.48]) == {
        "median": 0.52,
        "min": 0.36,
        "max": 1.04,
        "n": 5,
    }
    assert bench_results.spread([2.0, 4.0])["median"] == 3.0
    with pytest.raises(ValueError):
        bench_results.spread([])


def test_a_saved_result_loads_back_and_a_missing_one_is_none(tmp_path):
    path = bench_results.save("churn", {"seed": 0, "policies": {}}, folder=tmp_path)
    assert path == tmp_path / "churn.json" and path.read_text().count("\n") == 1
    assert bench_results.load("churn", folder=tmp_path) == {"seed": 0, "policies": {}}
    assert bench_results.load("router", folder=tmp_path) is None


def comparison(clients, petals, ours):
    return {
        "clients": clients,
        "decode_ms": [petals, ours],
        "ttft_ms": [2 * petals, 2 * ours],
        "aggregate_tokens_per_s": [1000 / petals, 1000 / ours],
    }


def test_side_by_side_series_orders_the_clients_and_splits_the_systems():
    result = {"models": {"tiny": {"by_clients": [comparison(4, 40.0, 20.0), comparison(1, 10.0, 8.0)]}}}
    series = charts.side_by_side_series(result)["tiny"]
    assert series["decode_ms"]["Petals 2.2.0"] == ([1, 4], [10.0, 40.0])
    assert series["decode_ms"]["hexswarm"] == ([1, 4], [8.0, 20.0])
    assert series["aggregate_tokens_per_s"]["hexswarm"] == ([1, 4], [125.0, 50.0])


def test_rolling_mean_is_centered_and_skips_samples_without_requests():
    assert charts.rolling_mean([1.0, 2.0, 3.0, 4.0], 3) == [1.5, 2.0, 3.0, 3.5]
    assert charts.rolling_mean([None, 1.0, None], 1) == [None, 1.0, None]
    assert charts.rolling_mean([None, 1.0, None], 3) == [1.0, 1.0, 1.0]


def test_churn_series_gives_attainment_and_the_share_of_gpus_in_chains():
    timeline = {"minute": [0.0, 0.5], "attainment": [0.8, None], "gpus_in_chains": [150, 90]}
    result = {"gpus_present": [200, 180], "policies": {"coordinator": {"timeline": timeline}}}
    minutes, attainment, coverage = charts.churn_series(result, width=1)["coordinator"]
    assert minutes == [0.0, 0.5] and attainment == [0.8, None] and coverage == [0.75, 0.5]


def test_front_series_keeps_one_seed_and_rows_with_fronts():
    front = {"ours": [[10.0, 5.0]], "sweep": [[10.0, 5.0]], "min_latency_ms": 10.0}
    rows = [
        {"peers": 100, "seed": 0, "front_points": front},
        {"peers": 100, "seed": 1, "front_points": front},
        {"peers": 500, "seed": 0},  # --load-only: no fronts
    ]
    assert charts.front_series({"rows": rows}) == {100: front}


def test_real_model_load_figures_are_per_block_loaded():
    import real_model

    figures = {"load_s_peer": 0.093, "load_s_local": 0.191, "rss_mb_peer": 213.5, "rss_mb_local": 527.2}
    assert real_model.per_block(figures, peer_blocks=15, model_blocks=30) == {
        "load_ms_per_block_peer": 6.2,
        "load_ms_per_block_local": 6.37,
        "rss_mb_per_block_peer": 14.23,
        "rss_mb_per_block_local": 17.57,
    }


def test_disaggregation_repeats_are_summarized_per_ratio_and_layout():
    import disaggregation_swarm as bench

    runs = []
    for ratio in (0.36, 1.04, 0.5):
        run = {key: ratio for key in bench.RATIOS}
        for figure in bench.FIGURES:
            run |= {f"{figure}_colocated": 100.0, f"{figure}_disaggregated": 100.0 * ratio}
        runs.append(run)
    summary = bench.summarize_runs(runs)
    assert summary["p99_ratio"] == {"median": 0.5, "min": 0.36, "max": 1.04, "n": 3}
    assert summary["ttft_long_ms_disaggregated"]["max"] == 104.0
    assert summary["p50_ms_colocated"]["median"] == 100.0


def test_side_by_side_series_puts_the_real_model_first():
    rows = {"by_clients": [comparison(1, 10.0, 8.0)]}
    result = {"models": {"tiny": rows, "other": rows, "smollm2": rows}}
    assert list(charts.side_by_side_series(result)) == ["smollm2", "tiny", "other"]


def test_scale_fits_the_growth_of_a_figure_in_n_on_log_scales():
    lines = [
        {"peers": 10, "bytes": 100.0},
        {"peers": 100, "bytes": 1000.0},
        {"peers": 1000, "bytes": 10000.0},
    ]
    assert scale.growth_exponent(lines, "bytes") == 1.0
    flat = [{"peers": 25, "bytes": 7.0}, {"peers": 100, "bytes": 7.0}]
    assert scale.growth_exponent(flat, "bytes") == 0.0
    assert scale.growth_exponent(lines[:1], "bytes") is None


def test_scale_counts_a_values_subkeys_and_records():
    entry = SimpleNamespace  # hivemind's ValueWithExpiration: .value (and .expiration_time)
    value = entry(value={b"owner-and-signature": entry(value=b"record"), b"k2": entry(value=b"r2")})
    assert scale.value_bytes(value) == len(b"owner-and-signature") + len(b"record") + 2 + 2
    assert scale.value_bytes(None) == 0 and scale.value_bytes(entry(value=b"not a dictionary")) == 0
