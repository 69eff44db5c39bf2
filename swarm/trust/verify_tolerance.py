"""How far two honest computations of one span may differ: per token, relative to that token.

A hidden state's scale varies by orders of magnitude between tokens (on SmolLM2 a typical
token's values are about 2, while the first token's largest value is over 20,000), so the
error of each token is measured against that token's own size, never the step's maximum:

- `token_error`: ||ours - theirs|| / ||theirs|| for each token (the relative L2 error), and
- `topk_agreement`: the share of the witness's `TOP_K` largest-magnitude dimensions that are
  also among ours, for each token.

A comparison passes when every token's error is under the format's `max_token_error`, the
mean squared error of the tokens compared is under `max_mean_square_error` (which catches a
small bias spread over many tokens, such as added noise, that no single token shows), and the
mean top-k agreement is at least `min_topk_agreement`.

The thresholds were calibrated on SmolLM2-135M-Instruct (benchmarks/verify_calibration.py):
honest peers that differ in how they computed (incremental decode, batched decode, one
prefill-shaped pass) in each weight format and compute dtype. docs/reliability.md lists the
measured honest errors, the margin, and what each attack scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOP_K = 8


@dataclass(frozen=True)
class Tolerance:
    max_token_error: float  # relative L2 error of any one token
    max_mean_square_error: float  # mean of the tokens' squared relative errors
    min_topk_agreement: float  # mean share of the witness's top-k dimensions that are also ours


# By the coarsest format of the two computations (client/verify.py picks it); see the module doc.
# Measured honest worst token / run mean square error (SmolLM2, 1,536 tokens a format): float32
# 8.1e-6 / 4.8e-13 mean; float16 5.3e-3 / 1.4e-6 mean; bfloat16 0.054 / 2.3e-4; int8 0.092 / 4.1e-4.
TOLERANCES = {
    "float32": Tolerance(1e-3, 1e-6, 0.9),  # room for TF32-like kernels on another device
    "float16": Tolerance(2e-2, 1e-5, 0.75),
    "bfloat16": Tolerance(0.25, 2e-3, 0.6),
    "int8": Tolerance(0.25, 2e-3, 0.6),
}
# Coarsest last: what two formats are compared at.
COARSENESS = ("float32", "float16", "bfloat16", "int8")


def coarsest(formats: list[str]) -> str:
    """The coarsest of `formats` (an unknown one counts as the coarsest known)."""
    known = [f if f in COARSENESS else COARSENESS[-1] for f in formats]
    return max(known, key=COARSENESS.index)


@dataclass(frozen=True)
class Comparison:
    tokens: int
    worst_token_error: float
    mean_square_error: float
    topk_agreement: float
    agree: bool

    def describe(self) -> str:
        return (
            f"worst token error {self.worst_token_error:.3g}, mean square error {self.mean_square_error:.3g}, "
            f"top-{TOP_K} agreement {self.topk_agreement:.2f} over {self.tokens} tokens"
        )


def token_errors(ours: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """Relative L2 error of each token: (..., hidden) -> (...)."""
    ours, theirs = ours.float(), theirs.float()
    size = theirs.norm(dim=-1).clamp(min=1e-12)
    return (ours - theirs).norm(dim=-1) / size


def topk_agreement(ours: torch.Tensor, theirs: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    """Share of the witness's k largest-magnitude dimensions that are also ours, per token."""
    k = min(k, theirs.shape[-1])
    mine = ours.float().abs().topk(k, dim=-1).indices
    witness = theirs.float().abs().topk(k, dim=-1).indices
    shared = (mine.unsqueeze(-1) == witness.unsqueeze(-2)).any(dim=-1)
    return shared.float().mean(dim=-1)


def compare(ours: torch.Tensor, theirs: torch.Tensor, tolerance: Tolerance) -> Comparison:
    """Whether `ours` is an honest computation of what the witness computed as `theirs`. A token
    non-finite in `ours` but finite in `theirs` disagrees; tokens non-finite in `theirs` (its
    computation overflowed, e.g. fp16 on huge inputs) are left out, since neither side can be
    judged there; if that leaves nothing, the comparison agrees (nothing is proven)."""
    if ours.shape != theirs.shape or ours.numel() == 0:
        return Comparison(0, float("inf"), float("inf"), 0.0, False)
    ours_bad, theirs_bad = ((~torch.isfinite(x)).any(dim=-1) for x in (ours, theirs))
    if bool((ours_bad & ~theirs_bad).any()):  # non-finite where an honest computation is not
        return Comparison(ours.shape[:-1].numel(), float("inf"), float("inf"), 0.0, False)
    judged = ~theirs_bad  # where the witness overflowed too (huge inputs in a narrow dtype), nobody can tell
    if not bool(judged.any()):
        return Comparison(0, float("nan"), float("nan"), float("nan"), True)
    ours, theirs = ours[judged], theirs[judged]
    errors = token_errors(ours, theirs).flatten()
    agreement = float(topk_agreement(ours, theirs).mean())
    worst, mse = float(errors.max()), float((errors**2).mean())
    agree = (
        worst <= tolerance.max_token_error
        and mse <= tolerance.max_mean_square_error
        and agreement >= tolerance.min_topk_agreement
    )
    return Comparison(errors.numel(), worst, mse, agreement, agree)
