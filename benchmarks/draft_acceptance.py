"""How many tokens a pass prompt lookup can give on wan.py's workloads, with no swarm and no pacing.

Runs local transformers' greedy `generate` on SmolLM2-135M-Instruct with
`prompt_lookup_num_tokens=k` and `max_matching_ngram_size=n` for each k and n given, counts the
model's forward passes, and prints one JSON line per workload, k and n: `tokens_per_pass` (new
tokens ÷ passes: what the swarm's speculative steps could keep at best, since client/drafting.py
only checks fewer drafts than k) and `exact` (equal to plain greedy output). This bounds what
speculation through the swarm can save on a workload: a token on a WAN costs about a pass's
round trips ÷ tokens a pass (docs/speculation.md).

    python benchmarks/draft_acceptance.py [--workloads rewrite summarize] [--drafts 8 12 16] [--ngrams 2 3] [--save]

(--save: also write the lines to benchmarks/results/draft_acceptance.json)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_results import save  # noqa: E402
from wan import model_and_prompts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["rewrite", "summarize"])
    parser.add_argument("--drafts", type=int, nargs="+", default=[4, 8, 12, 16, 24])
    parser.add_argument("--ngrams", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    spec, prompts, expected = model_and_prompts(args.new_tokens, tuple(args.workloads))
    model = AutoModelForCausalLM.from_pretrained(spec.path).eval()
    passes = count_passes(model)
    lines = []
    for name in args.workloads:
        ids, want = prompts[name][0], expected[name][0]
        for drafts in args.drafts:
            for ngram in args.ngrams:
                passes["n"] = 0
                out = model.generate(
                    ids,
                    max_new_tokens=args.new_tokens,
                    do_sample=False,
                    prompt_lookup_num_tokens=drafts,
                    max_matching_ngram_size=ngram,
                )
                new = out.shape[1] - ids.shape[1]
                line = {
                    "bench": "draft_acceptance",
                    "workload": name,
                    "drafts": drafts,
                    "ngram": ngram,
                    "tokens_per_pass": round(new / passes["n"], 2),
                    "exact": bool(torch.equal(out, want)),
                }
                print(json.dumps(line), flush=True)
                lines.append(line)
    if args.save:
        save("draft_acceptance", {"bench": "draft_acceptance", "model": spec.model_id, "lines": lines})


def count_passes(model) -> dict:
    """Counts the model's forward passes in the returned dict's "n"."""
    passes = {"n": 0}
    forward = model.forward

    def counted(*args, **kwargs):
        passes["n"] += 1
        return forward(*args, **kwargs)

    model.forward = counted
    return passes


if __name__ == "__main__":
    main()
