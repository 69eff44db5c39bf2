"""The interference model (routing/scheduler/simulation/interference.py): its fit, and what it does to the
colocated serving simulation (routing/scheduler/simulation/serving_sim.py), on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from hexswarm.routing.scheduler.simulation.interference import MEASURED, MEASURED_POINTS, Interference, fit
from hexswarm.routing.scheduler.simulation.serving_sim import simulate
from hexswarm.routing.scheduler.simulation.stage_costs import StageCosts


def one_stage(prefill: float = 1.0, step: float = 1.0, requests: int = 2) -> StageCosts:
    """One stage: every prefill `prefill` s, a decode step of one sequence `step` s, no hops,
    memory for everything."""
    return StageCosts(
        prefill_s=np.full((1, requests), prefill),
        step_s=np.array([[0.0, step]]),
        hop_prefill_s=np.zeros((1, requests)),
        hop_step_s=np.zeros((1, 2)),
        kv_budget=np.array([1e12]),
        kv_per_token=np.ones(1),
    )


def test_the_fit_is_the_least_squares_line_through_zero_flat_past_the_longest_prompt():
    model = fit([100, 200], [0.5, 1.0])
    assert model == Interference(tokens_per_unit=200.0, max_tokens=200.0)
    assert model.kappa([0, 100, 200, 400]).tolist() == [0.0, 0.5, 1.0, 1.0]
    assert model.inflation(100) == pytest.approx(1.5)


@pytest.mark.parametrize(
    "tokens,ratios", [([], []), ([100], [0.5, 1.0]), ([0, 100], [0.0, 0.5]), ([100, 200], [-0.1, -0.2])]
)
def test_the_fit_refuses_what_it_cannot_fit(tokens, ratios):
    with pytest.raises(ValueError):
        fit(tokens, ratios)


def test_the_measured_model_is_the_one_the_docstring_quotes():
    """benchmarks/interference.py's figures: one unit per ~703 prompt tokens, a 1,024-token
    prompt costing 2.46 x its time alone next to decoding sequences."""
    assert MEASURED.tokens_per_unit == pytest.approx(703.4, abs=0.5)
    assert MEASURED.max_tokens == max(n for n, _ in MEASURED_POINTS)
    assert float(MEASURED.inflation(1024)) == pytest.approx(2.46, abs=0.01)
    for tokens, ratio in MEASURED_POINTS:  # the line passes within 10% of every measured point
        assert float(MEASURED.kappa(tokens)) == pytest.approx(ratio, rel=0.1)


def test_a_prefill_next_to_a_decoding_sequence_costs_its_stage_more():
    """A arrives at 0, B at 0.5, prompts of 100 tokens, 2 decode steps each, kappa(100) = 1.

    Without interference: A's prefill [0, 1], B's [1, 2] (prefill first), then one step each in
    turn: A [2, 3], B [3, 4], A [4, 5], B [5, 6]. With it, B's prefill starts while A decodes
    and takes 2 s, [1, 3]: everything after moves 1 s later. A's own prefill had nothing
    decoding beside it and costs 1 s either way."""
    costs, arrivals, tokens = one_stage(), np.array([0.0, 0.5]), np.array([102.0, 102.0])
    first = lambda r, n: 0  # noqa: E731 - one pipeline takes everything
    plain = simulate([costs], arrivals, tokens, 2, first)
    assert plain.tolist() == [5.0, 6.0]
    assert simulate([costs], arrivals, tokens, 2, first, interference=None).tolist() == plain.tolist()
    slowed = simulate([costs], arrivals, tokens, 2, first, Interference(tokens_per_unit=100, max_tokens=1000))
    assert slowed.tolist() == [6.0, 7.0]


def test_a_request_alone_is_never_slowed():
    costs = one_stage(requests=1)
    done = simulate([costs], np.array([0.0]), np.array([102.0]), 2, lambda r, n: 0, MEASURED)
    assert done.tolist() == [3.0]  # prefill 1 s, two steps of 1 s


def test_interference_costs_tokens_per_second_at_saturation():
    """Many requests at once: the stage is never idle, so every extra prefill second is a
    second of decode it does not run."""
    requests = 40
    costs = one_stage(prefill=0.5, step=0.2, requests=requests)
    arrivals, tokens = np.zeros(requests), np.full(requests, 512.0 + 8)
    plain = simulate([costs], arrivals, tokens, 8, lambda r, n: 0)
    slowed = simulate([costs], arrivals, tokens, 8, lambda r, n: 0, MEASURED)
    # the first prefill runs alone; the other 39 next to decoding sequences
    extra = (requests - 1) * 0.5 * float(MEASURED.kappa(512))
    assert slowed.max() == pytest.approx(plain.max() + extra)
