"""`python -m client MODEL --initial-peers ... --prompt ...`: generate text through a swarm."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from swarm import log_setup


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client", description=__doc__)
    parser.add_argument(
        "model_dir",
        metavar="MODEL",
        help="a built-in model name (hexswarm models), a GGUF file or a checkpoint directory",
    )
    parser.add_argument("--initial-peers", nargs="+", required=True)
    parser.add_argument(
        "--prompt", default=None, help="text to complete (default: one, unless --chat is given)"
    )
    parser.add_argument(
        "--chat", default=None, help="a user message, answered through the model's chat template"
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--sample", action="store_true", help="sample (seed 0) instead of greedy decoding")
    log_setup.add_log_arguments(parser, default="warning")
    args = parser.parse_args(argv)
    log_setup.setup_logging(args, f"client {os.path.basename(os.path.normpath(args.model_dir))}")

    from transformers import AutoTokenizer

    from client import DistributedModelForCausalLM

    model = DistributedModelForCausalLM.from_pretrained(args.model_dir, initial_peers=args.initial_peers)
    tokenizer = AutoTokenizer.from_pretrained(model.spec.path)  # a GGUF file's: from its metadata
    prompt = args.prompt if args.prompt is not None or args.chat else "A swarm of volunteers"
    try:
        if prompt is not None:
            _generate(
                model, tokenizer, "prompt", prompt, tokenizer(prompt, return_tensors="pt").input_ids, args
            )
        if args.chat:
            messages = [{"role": "user", "content": args.chat}]
            input_ids = _chat_ids(tokenizer, messages)
            _generate(model, tokenizer, "chat", args.chat, input_ids, args)
        return 0
    finally:
        model.shutdown()


def _generate(model, tokenizer, kind: str, text: str, input_ids: torch.Tensor, args) -> None:
    """Generates from `input_ids` and prints the chain, the text, the output and the speed."""
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
    print(f"{kind}: {text!r}")
    print(f"output: {tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True)!r}")
    print(f"chain: {model.last_route}")
    print(f"{new_tokens} tokens in {elapsed:.2f} s: {new_tokens / elapsed:.1f} tokens/s", flush=True)


def _chat_ids(tokenizer, messages: list[dict]) -> torch.Tensor:
    """The chat template applied to `messages`, ending where the assistant's answer begins."""
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    return encoded["input_ids"] if not isinstance(encoded, torch.Tensor) else encoded


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
