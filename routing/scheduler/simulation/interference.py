"""Prefill-decode interference as a cost in tokens/s: a prompt prefilled next to decoding
sequences costs its stage more than the same prompt and decode steps one after the other.

HexGen-2 §2 ("Batching", Figure 1): batching a prefill with ongoing decode steps slows both,
the more the longer the prompt, and disaggregation exists to remove that. `serving_sim.py`
runs a waiting prefill whole before any decode batch, so there a decode step only waits: a
stage's time is the sum of its prefills and decode batches, and interference costs latency,
never tokens/s. A peer does not run prompts whole while others decode. Its scheduler
(peer/scheduler.py) runs a prompt in chunks sized to about one decode batch's time
(`--interleave-ratio 1`, at least 16 tokens), one chunk between decode batches, so that a
decode step waits for one chunk rather than the whole prompt; each chunk is a forward of its
own, which scans the weights again.

Measured on a live peer (`benchmarks/interference.py`: SmolLM2-135M, all 30 blocks on one
`run-peer`, the 2-core CPU VM, one session decoding one sequence back to back while another
session's prompt of N tokens is prefilled; docs/benchmarks.md has the run):

| N | decode step alone | during the prompt | prompt alone | prompt during | excess / prompt alone |
|---|---|---|---|---|---|
| 128 | 54.3 ms | 156.0 ms (2.88 x) | 730 ms | 1,247 ms | 0.19 |
| 512 | | 157.5 ms (2.90 x) | 1,913 ms | 5,092 ms | 0.78 |
| 1024 | | 166.1 ms (3.06 x) | 3,103 ms | 10,953 ms | 1.43 |

The excess is the prompt's time while decoding, less its time alone, less the decode steps
that ran inside it at their time alone: what the peer spent beyond doing the two one after the
other. It grows about linearly with N (the chunks stay ~16 tokens, each at the cost of a
forward, while a whole prompt's chunks of 256 tokens get cheaper per token), so the model is

    kappa(N) = min(N, max_tokens) / tokens_per_unit      (least squares through 0)

and a prefill of N prompt tokens that a stage runs while its pipeline has sequences decoding
costs (1 + kappa(N)) x its time alone (`serving_sim.py`); kappa stays flat past the longest
measured prompt, where both ways of running a prompt cost a fixed time per token. Fitted
here: one unit per 703 tokens (a 1,024-token prompt costs 2.46 x its time alone). With the
peer's chunks fixed at 256 tokens (`--interleave-ratio 0`) the excess was 0.03-0.25 instead,
and a decode step waited 10-17 x its time alone: colocated, a peer trades one for the other.
A repeat while other jobs loaded the VM measured 0.6 x the excess at 1,024 tokens; the fit
keeps the quiet run's figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interference:
    """kappa(N) = min(N, max_tokens) / tokens_per_unit: the share of its time alone that a
    prompt of N tokens costs its stage on top, while sequences decode beside it."""

    tokens_per_unit: float  # prompt tokens per unit of kappa (a prompt this long costs 2 x)
    max_tokens: float  # the longest prompt measured; kappa stays flat beyond it

    def __post_init__(self) -> None:
        if not (self.tokens_per_unit > 0 and self.max_tokens > 0):
            raise ValueError("tokens_per_unit and max_tokens must be positive")

    def kappa(self, tokens: np.ndarray | float) -> np.ndarray:
        """Extra stage time, as a share of the prefill's time alone, for prompts of `tokens`."""
        return np.minimum(np.asarray(tokens, dtype=float), self.max_tokens) / self.tokens_per_unit

    def inflation(self, tokens: np.ndarray | float) -> np.ndarray:
        """1 + kappa: what a prefill of `tokens` costs next to decoding sequences, in units of
        its time alone."""
        return 1.0 + self.kappa(tokens)


def fit(tokens: Sequence[float], excess_ratio: Sequence[float]) -> Interference:
    """The least-squares line through the origin of excess / prompt-alone against prompt tokens
    (`benchmarks/interference.py`'s `by_tokens`), flat past the longest prompt measured."""
    n = np.asarray(tokens, dtype=float)
    k = np.asarray(excess_ratio, dtype=float)
    if len(n) == 0 or len(n) != len(k) or np.any(n <= 0):
        raise ValueError("need as many positive prompt lengths as excess ratios, at least one")
    slope = float(n @ k) / float(n @ n)
    if slope <= 0:
        raise ValueError(
            f"the excess does not grow with the prompt (slope {slope:.3g}): no interference to fit"
        )
    return Interference(tokens_per_unit=1.0 / slope, max_tokens=float(n.max()))


# benchmarks/interference.py, default flags (table above): (prompt tokens, excess / prompt alone)
MEASURED_POINTS = ((128, 0.187), (512, 0.782), (1024, 1.428))
MEASURED = fit(*zip(*MEASURED_POINTS, strict=True))
