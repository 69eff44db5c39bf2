"""`hexswarm generate MODEL --initial-peers ... --prompt ...`: generate text through a swarm."""

from __future__ import annotations

import argparse
import os
import sys
import time

from hexswarm.swarm.commands import cli_args
from hexswarm.swarm.tools import log_setup

LOG_LEVEL = "warning"  # the output is the generated text; a library's INFO lines would bury it
EXIT_AT_ONCE = True  # run() stops the DHT (and the client) it starts: swarm.commands.cli.exit_at_once
DEFAULT_PROMPT = "A swarm of volunteers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_model_argument(parser, positional=True)
    cli_args.add_initial_peers(parser)
    parser.add_argument(
        "--prompt",
        default=None,
        help=f"text to complete (default: {DEFAULT_PROMPT!r}, unless only --chat is given)",
    )
    parser.add_argument(
        "--chat", default=None, help="a user message, answered through the model's chat template"
    )
    parser.add_argument(
        "--max-new-tokens", type=cli_args.positive_int, default=32, help="tokens to generate for each"
    )
    parser.add_argument("--sample", action="store_true", help="sample (seed 0) instead of greedy decoding")
    parser.add_argument(
        "--speculate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="greedy: draft tokens from the context and check several in one pass through the chain, "
        "as many as pays (docs/speculation.md; the output is the same either way)",
    )
    parser.add_argument(
        "--coverage-timeout",
        type=cli_args.positive_float,
        default=60.0,
        help="seconds to wait for every block to be served (a line says what is missing after 2 s)",
    )
    parser.add_argument(
        "--replacement-wait",
        type=cli_args.non_negative_float,
        default=3.0,
        metavar="SECONDS",
        help="when no peer serves some blocks any more mid-generation, wait this long for one to "
        "join before stopping with what was generated (default: 3)",
    )
    cli_args.add_client_quant(parser)
    cli_args.add_client_verify(parser)


def run(args: argparse.Namespace) -> int:
    cli_args.check_model(args.model)  # before torch and transformers load
    log_setup.set_context(f"client {os.path.basename(os.path.normpath(args.model))}")
    from transformers import AutoTokenizer

    from hexswarm.client import (
        DistributedModelForCausalLM,
        FailoverError,
        MissingBlocksError,
        NotComparedError,
        RetryPolicy,
        UnsettledDisputeError,
    )
    from hexswarm.client.verify_records import VerificationError
    from hexswarm.swarm.models.model_spec import ModelSpecError

    try:
        model = DistributedModelForCausalLM.from_pretrained(
            args.model,
            initial_peers=args.initial_peers,
            quant=args.quant,
            verify=cli_args.client_verify(args),
            verify_min_compared=args.verify_min_compared,
            accept_unsettled=args.accept_unsettled,
            coverage_timeout=args.coverage_timeout,
            retry=RetryPolicy(replacement_wait_s=args.replacement_wait),
        )
    except ModelSpecError as e:
        raise cli_args.UsageError(str(e)) from None
    tokenizer = AutoTokenizer.from_pretrained(model.spec.path)  # a GGUF file's: from its metadata
    prompt = args.prompt if args.prompt is not None or args.chat else DEFAULT_PROMPT
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
    except (NotComparedError, UnsettledDisputeError) as e:  # the output exists, unchecked: so shown, exit 1
        text = tokenizer.decode(e.output[0, e.prompt_length :], skip_special_tokens=True)
        disputed = "DISPUTED, " if isinstance(e, UnsettledDisputeError) else ""
        print(f"output ({disputed}NOT VERIFIED): {text!r}")
        print(f"verified: {model.verify_stats.describe()}", flush=True)
        print(f"hexswarm generate: {e}", file=sys.stderr)
        return 1
    except (MissingBlocksError, FailoverError, VerificationError) as e:  # one line, not a traceback
        print_partial_output(tokenizer, e, model.verify)
        print(f"hexswarm generate: {e}", file=sys.stderr)
        return 1
    finally:
        model.shutdown()


def _generate(model, tokenizer, kind: str, text: str, input_ids, args) -> None:
    """Generates from `input_ids` and prints the chain, the text, the output and the speed.

    The output is printed as it is generated, unless the client verifies peers: a liar found
    a few steps later rolls the generation back (client/verify.py), so its text is printed
    once every step is checked."""
    import torch

    from hexswarm.client.drafting import MAX_DRAFTS

    torch.manual_seed(0)
    print(f"{kind}: {text!r}", flush=True)
    streamer = None if model.verify else output_printer(tokenizer)
    began = time.perf_counter()
    try:
        output = model.generate(
            input_ids,
            max_new_tokens=args.max_new_tokens,
            do_sample=args.sample,
            pad_token_id=tokenizer.pad_token_id,
            streamer=streamer,
            **({"prompt_lookup_num_tokens": MAX_DRAFTS} if args.speculate and not args.sample else {}),
        )
    except BaseException:
        if streamer is not None:
            print(flush=True)  # the error's line starts on a line of its own
        raise
    elapsed = time.perf_counter() - began
    new_tokens = output.shape[1] - input_ids.shape[1]
    if streamer is None:
        print(f"output: {tokenizer.decode(output[0, input_ids.shape[1] :], skip_special_tokens=True)!r}")
    first = f", the first after {streamer.first_at - began:.2f} s" if streamer and streamer.first_at else ""
    print(f"chain: {model.last_route}")
    print(f"{new_tokens} tokens in {elapsed:.2f} s: {new_tokens / elapsed:.1f} tokens/s{first}", flush=True)
    if model.verify:
        print(f"verified: {model.verify_stats.describe()}", flush=True)


def print_partial_output(tokenizer, error: Exception, verified: bool) -> None:
    """What was generated before the swarm failed, when it was not streamed already."""
    tokens = getattr(error, "partial_output", None)
    prompt_length = getattr(error, "prompt_length", None)
    if tokens is None or prompt_length is None or not verified or tokens.shape[1] <= prompt_length:
        return
    text = tokenizer.decode(tokens[0, prompt_length:], skip_special_tokens=True)
    print(f"output so far (not all of it verified): {text!r}", flush=True)


def output_printer(tokenizer):
    """A transformers streamer that prints `output: '...'` word by word as tokens arrive, escaped
    as the whole text's repr would be (no control character reaches the terminal), and notes
    when the first new token came (`first_at`)."""
    from transformers import TextStreamer

    class OutputPrinter(TextStreamer):
        def __init__(self):
            super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
            self.first_at: float | None = None
            print("output: '", end="", flush=True)

        def put(self, value) -> None:
            if self.first_at is None and not self.next_tokens_are_prompt:
                self.first_at = time.perf_counter()
            super().put(value)

        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            print(quoted_part(text), end="'\n" if stream_end else "", flush=True)

    return OutputPrinter()


def quoted_part(text: str) -> str:
    """`text` escaped as inside a single-quoted Python string literal, as `repr` shows it."""
    return "".join("\\'" if ch == "'" else repr(ch)[1:-1] for ch in text)


def _chat_ids(tokenizer, messages: list[dict]):
    """The chat template applied to `messages`, ending where the assistant's answer begins: (1, T) ids."""
    import torch

    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    return encoded["input_ids"] if not isinstance(encoded, torch.Tensor) else encoded
