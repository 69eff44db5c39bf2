"""Speculative steps: how many drafted tokens each pass through the chain checks.

Hugging Face's assisted generation drafts tokens (`prompt_lookup_num_tokens=k`: n-grams found
in the context; `assistant_model=`: a small local model with the same tokenizer), runs them
with the last token as one forward pass, and keeps the drafts up to the first the model
disagrees with, plus the model's own next token; greedy output stays the model's. Through the
swarm that pass is one step down the chain, and each peer rolls its cache back past the kept
tokens at the next step (peer/core.py, docs/speculation.md).

A pass with d drafts costs one chain round trip plus d more tokens of compute, and yields
(1 - a^(d+1)) / (1 - a) tokens at a per-token acceptance rate a (Leviathan et al., "Fast
Inference from Transformers via Speculative Decoding", §3.1). `Acceptance` measures a from
what a generation's passes kept; `DraftLength` fits the cost, a least-squares line through a
client's recent passes' seconds against their tokens, and drafts the d that yields most
tokens a second: many on a WAN, where the round trip dominates; few or none on a LAN when
drafts are often wrong.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers.generation.candidate_generator import CandidateGenerator

MAX_DRAFTS = 8  # drafted tokens per pass at most, whatever the generator offers
TIMED_PASSES = 32  # the recent passes a cost line is fitted through
ACCEPTANCE_DECAY = 0.9  # weight of the past in the acceptance rate, per pass with drafts
PROBE_EVERY = 8  # passes without drafts before one with a single draft re-measures acceptance


@dataclass
class Acceptance:
    """How often one generation's drafts hold: a = matched / (matched + rejected), counted with
    decay (prior a = 0.5). It is the text's, so each generation has its own."""

    matched: float = 1.0
    rejected: float = 1.0
    passes_without_drafts: int = 0

    @property
    def rate(self) -> float:
        return self.matched / (self.matched + self.rejected)

    def judged(self, drafts: int, matched: int) -> None:
        """The model kept `matched` of a pass's `drafts` drafted tokens."""
        if drafts == 0:
            self.passes_without_drafts += 1
            return
        self.passes_without_drafts = 0
        self.matched = ACCEPTANCE_DECAY * self.matched + matched
        self.rejected = ACCEPTANCE_DECAY * self.rejected + (1 if matched < drafts else 0)


@dataclass
class DraftLength:
    """What a pass through the chain costs, measured over a client's generations (it is the
    chain's), and the number of drafts that pays best at a given acceptance."""

    max_drafts: int = MAX_DRAFTS
    timed: deque = field(default_factory=lambda: deque(maxlen=TIMED_PASSES))  # (tokens, seconds)
    passes: int = 0  # decode passes timed since this client started
    drafted: int = 0  # drafted tokens checked, and kept, since this client started
    kept: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # threads share it

    def cost(self) -> tuple[float, float] | None:
        """(seconds of a one-token pass, seconds per extra token), fitted; None before two
        different pass lengths were timed."""
        with self.lock:
            timed = np.array(self.timed, dtype=float).reshape(-1, 2)
        tokens, seconds = timed[:, 0], timed[:, 1]
        if len(set(tokens)) < 2:
            return None
        slope, intercept = np.polyfit(tokens, seconds, 1)
        per_token = max(float(slope), 0.0)
        return max(float(intercept) + per_token, 1e-6), per_token

    def plan(self, acceptance: Acceptance) -> int:
        """The drafts the next pass should check, before knowing how many the drafter has."""
        cost = self.cost()
        if cost is None:  # not measured yet: a few, so that both sides of the line get timed
            return min(4, self.max_drafts)
        one, per_token = cost
        a = min(acceptance.rate, 0.99)
        rates = [(1 - a ** (d + 1)) / (1 - a) / (one + d * per_token) for d in range(self.max_drafts + 1)]
        best = int(np.argmax(rates))
        if best == 0 and acceptance.passes_without_drafts >= PROBE_EVERY:
            return 1  # acceptance may have changed since drafting stopped paying
        return best

    def passed(self, tokens: int, seconds: float) -> None:
        """A decode pass of `tokens` tokens (1 + drafts) took `seconds` on the chain."""
        with self.lock:
            self.timed.append((tokens, seconds))
            self.passes += 1

    def counted(self, drafts: int, matched: int) -> None:
        with self.lock:
            self.drafted, self.kept = self.drafted + drafts, self.kept + matched


class PacedDrafts(CandidateGenerator):
    """Hugging Face's candidate generator, its drafts cut to what `DraftLength` plans."""

    def __init__(self, drafter: CandidateGenerator, length: DraftLength, max_length: int):
        self.drafter, self.length, self.drafts = drafter, length, 0
        self.acceptance = Acceptance()  # this generation's
        self.max_length = max_length  # of the sequence: a pass never reaches past the session's end
        self.requires_model_outputs = getattr(drafter, "requires_model_outputs", False)
        self.asked = False  # whether the drafter was asked this pass (it learns only from those)

    def __getattr__(self, name: str):  # what else generate() reads of its drafter
        if name == "drafter":
            raise AttributeError(name)
        return getattr(self.drafter, name)

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs):
        planned = min(self.length.plan(self.acceptance), self.max_length - input_ids.shape[1])
        self.asked = planned > 0
        if not self.asked:
            self.drafts = 0
            return input_ids, None
        if hasattr(self.drafter, "num_assistant_tokens"):  # a draft model: draft no more than planned
            self.drafter.num_assistant_tokens = planned
        candidates, logits = self.drafter.get_candidates(input_ids, **kwargs)
        self.drafts = min(planned, candidates.shape[1] - input_ids.shape[1])
        keep = input_ids.shape[1] + self.drafts
        return candidates[:, :keep], None if logits is None else logits[:, : self.drafts]

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        self.acceptance.judged(self.drafts, int(num_matches))
        self.length.counted(self.drafts, int(num_matches))
        if self.asked:
            self.drafter.update_candidate_strategy(input_ids, scores, num_matches)


def rolls_back(config) -> bool:
    """Whether peers can drop a session's rejected drafts: full attention only (a sliding window
    has already forgotten what a roll-back needs; peer/blocks.py BlockStack.rolls_back)."""
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    return layer_types == {"full_attention"} and not getattr(config, "sliding_window", None)
