"""The per-token comparison of swarm/trust/verify_tolerance.py, and the bans file of swarm/trust/bans.py."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from hexswarm.swarm.trust.bans import add_ban, load_bans, new_ban
from hexswarm.swarm.trust.verify_tolerance import TOLERANCES, coarsest, compare, token_errors, topk_agreement


def _hidden(tokens: int = 16, size: int = 64, seed: int = 0) -> torch.Tensor:
    h = torch.randn(1, tokens, size, generator=torch.Generator().manual_seed(seed))
    h[0, 0, 3] = 20_000.0  # a first token with a massive activation, as SmolLM2 has
    return h


def test_each_token_is_measured_against_its_own_size():
    h = _hidden()
    off = h.clone()
    off[0, 5] += 0.05 * off[0, 5].norm() / off.shape[-1] ** 0.5  # 5% of token 5's RMS
    errors = token_errors(off, h)[0]
    assert errors[5] > 1e-2 and float(errors[:5].max()) == 0.0
    # the old rule (the step's largest value) would have let this through at float32
    assert compare(off, h, TOLERANCES["float32"]).agree is False


def test_noise_at_one_percent_of_each_tokens_rms_fails_float32_and_float16():
    h = _hidden(64)
    rms = h.pow(2).mean(dim=-1, keepdim=True).sqrt()
    noisy = h + 0.01 * rms * torch.randn_like(h)
    for name in ("float32", "float16"):
        result = compare(noisy, h, TOLERANCES[name])
        assert not result.agree, (name, result.describe())


def test_honest_rounding_passes_at_its_format():
    h = _hidden()
    assert compare(h.to(torch.bfloat16).float(), h, TOLERANCES["bfloat16"]).agree
    assert compare(h.to(torch.float16).float(), h, TOLERANCES["float16"]).agree
    assert compare(h + 1e-7 * h.abs(), h, TOLERANCES["float32"]).agree


def test_shape_nan_and_topk_disagreement_fail():
    h = _hidden()
    assert not compare(h[:, :-1], h, TOLERANCES["bfloat16"]).agree
    bad = h.clone()
    bad[0, 2, 0] = float("nan")
    assert not compare(bad, h, TOLERANCES["bfloat16"]).agree
    shuffled = h[..., torch.randperm(h.shape[-1])]
    assert float(topk_agreement(shuffled, h).mean()) < 0.5


def test_overflow_on_both_sides_proves_nothing_and_one_sided_overflow_is_wrong():
    """An fp16 peer fed huge (finite) inputs overflows honestly; a recomputation cast to fp16
    overflows alike, so those tokens are left out instead of counting as a lie (issue 49)."""
    h = _hidden()
    huge = h.clone()
    huge[0, 1] *= 1e6  # one token past fp16's range
    signed, recomputed = huge.to(torch.float16), huge.float().to(torch.float16)
    assert torch.isinf(signed[0, 1]).any() and compare(signed, recomputed, TOLERANCES["float16"]).agree
    everything = torch.full_like(signed, float("inf"))
    assert compare(everything, everything, TOLERANCES["float16"]).agree  # nothing left to judge
    lie = h.to(torch.float16).clone()
    lie[0, 1, 0] = float("inf")  # non-finite where the honest value is small
    assert not compare(lie, h.to(torch.float16), TOLERANCES["float16"]).agree


def test_the_coarsest_format_sets_the_tolerance():
    assert coarsest(["float32", "bfloat16"]) == "bfloat16"
    assert coarsest(["float32", "int8", "float16"]) == "int8"
    assert coarsest(["float32", "float64"]) == "int8"  # unknown: as coarse as the coarsest known


def test_bans_persist_and_merge(tmp_path):
    path = tmp_path / "bans.json"
    add_ban(new_ban("QmA", "m", 0, 15, "wrong output"), path)
    add_ban(new_ban("QmB", "m", 15, 30, "wrong output"), path)
    bans = load_bans(path)
    assert set(bans) == {"QmA", "QmB"} and bans["QmB"].start == 15
    path.write_text("{not json")
    assert load_bans(path) == {}  # a broken file bans nobody, and says so in the log
    path.write_text(json.dumps({"QmC": {"peer_id": "QmC", "unexpected": 1}}))
    assert load_bans(path) == {}


def test_a_ban_expires_after_its_time():
    from hexswarm.swarm.trust.bans import BAN_TTL_S

    path = Path(tempfile.mkdtemp()) / "bans.json"
    add_ban(new_ban("QmOld", "m", 0, 15, "wrong output"), path)
    now = load_bans(path)["QmOld"].time
    assert set(load_bans(path, now=now + BAN_TTL_S - 1)) == {"QmOld"}
    assert load_bans(path, now=now + BAN_TTL_S + 1) == {}
