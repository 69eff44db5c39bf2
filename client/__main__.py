"""`python -m client MODEL_DIR --initial-peers ... --prompt ...`: generate text through a swarm."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from swarm import log_setup


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client", description=__doc__)
    parser.add_argument("model_dir")
    parser.add_argument("--initial-peers", nargs="+", required=True)
    parser.add_argument("--prompt", default="A swarm of volunteers")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--sample", action="store_true", help="sample (seed 0) instead of greedy decoding")
    log_setup.add_log_arguments(parser, default="warning")
    args = parser.parse_args(argv)
    log_setup.setup_logging(args, f"client {os.path.basename(os.path.normpath(args.model_dir))}")

    from transformers import AutoTokenizer

    from client import DistributedModelForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = DistributedModelForCausalLM.from_pretrained(args.model_dir, initial_peers=args.initial_peers)
    try:
        input_ids = tokenizer(args.prompt, return_tensors="pt").input_ids
        torch.manual_seed(0)
        began = time.perf_counter()
        output = model.generate(
            input_ids,
            max_new_tokens=args.max_new_tokens,
            do_sample=args.sample,
            pad_token_id=tokenizer.pad_token_id,
        )
        elapsed = time.perf_counter() - began
        new_tokens = output.shape[1] - input_ids.shape[1]
        print(f"chain: {model.last_route}")
        print(f"prompt: {args.prompt!r}")
        print(f"output: {tokenizer.decode(output[0, input_ids.shape[1] :])!r}")
        print(f"{new_tokens} tokens in {elapsed:.2f} s: {new_tokens / elapsed:.1f} tokens/s")
        return 0
    finally:
        model.shutdown()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
