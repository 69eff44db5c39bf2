"""`hexswarm make-tiny-model`: a small random-initialized checkpoint plus a tokenizer, built offline.

Tests, the demo and the benchmarks use these instead of downloaded models (no model hub is
reachable from where hexswarm is developed). The same arguments and seed give the same files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hexswarm.swarm.commands import cli_args

# A short text the byte-level BPE tokenizer learns its merges from. Any text works (byte-level
# BPE can encode every string); English prose gives merges that make demo output readable.
_TOKENIZER_CORPUS = (
    """
A swarm of volunteers serves a language model together. Each peer holds a few layers of the
network and passes hidden states to the next one, so no single machine needs the whole model.
The client embeds the prompt, sends it through a chain of peers, and turns the last hidden
state into the next token. When a peer leaves, the client finds another chain and carries on.
The quick brown fox jumps over the lazy dog. Peers announce the layers they serve in a shared
table; a coordinator plans who should serve what, and clients pick fast and lightly loaded
routes. Good systems measure before they guess, and they never trust what arrives from the
network without checking it first. Once upon a time there was a little model that generated
text one token at a time, and every token travelled across many computers owned by many people.
"""
    * 4
)

ARCHS = ("llama", "qwen2", "mistral", "qwen3", "gemma2", "gemma3", "phi3", "mixtral", "qwen3_moe")
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]
# A plain chat template, so `/v1/chat/completions` of the API server works with tiny models:
# "<s>user: hi\n</s>assistant: " (a real checkpoint brings its own in tokenizer_config.json).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    positive = cli_args.positive_int
    parser.add_argument("directory", type=Path, help="where to write the checkpoint")
    parser.add_argument("--arch", choices=ARCHS, default="llama", help="the model family (its model_type)")
    parser.add_argument("--layers", type=positive, default=8, help="transformer layers (blocks)")
    parser.add_argument("--hidden", type=positive, default=256, help="hidden size")
    parser.add_argument("--heads", type=positive, default=8, help="attention heads (they divide --hidden)")
    parser.add_argument(
        "--kv-heads", type=positive, default=4, help="key/value heads (GQA; they divide --heads)"
    )
    parser.add_argument(
        "--intermediate", type=positive, default=None, help="MLP size (default: about 2.7 x hidden)"
    )
    parser.add_argument("--vocab", type=positive, default=512, help="tokenizer vocabulary size to train")
    parser.add_argument(
        "--seed",
        type=cli_args.non_negative_int,
        default=0,
        help="seed of the random weights: same seed, same files",
    )
    parser.add_argument("--max-shard-size", default=None, help="split weights into shards, e.g. 500KB")


def run(args: argparse.Namespace) -> int:
    try:
        path = make_tiny_model(
            args.directory,
            arch=args.arch,
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            intermediate=args.intermediate,
            vocab=args.vocab,
            seed=args.seed,
            max_shard_size=args.max_shard_size,
        )
    except ValueError as e:  # heads that do not divide the hidden size, a bad --max-shard-size
        raise cli_args.UsageError(str(e)) from None
    print(path)
    return 0


def make_tiny_model(
    directory: str | Path,
    *,
    arch: str = "llama",
    layers: int = 8,
    hidden: int = 256,
    heads: int = 8,
    kv_heads: int = 4,
    intermediate: int | None = None,
    vocab: int = 512,
    seed: int = 0,
    max_shard_size: str | None = None,
) -> Path:
    """Writes config, safetensors weights, generation config and tokenizer to `directory`."""
    import torch
    from transformers import AutoModelForCausalLM

    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {ARCHS}")
    if hidden % heads or heads % kv_heads:
        raise ValueError("hidden must be divisible by heads, and heads by kv-heads")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(vocab)
    config = _make_config(arch, layers, hidden, heads, kv_heads, intermediate, tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **save_kwargs)
    tokenizer.save_pretrained(directory)
    return directory


def _make_config(arch, layers, hidden, heads, kv_heads, intermediate, tokenizer):
    import transformers

    intermediate = intermediate or (hidden * 11 // 4 // 16) * 16
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,  # Gemma's default (256) would not fit a tiny model
        max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        # Wider than the usual 0.02 so greedy output varies from token to token; with 0.02 a random
        # model repeats one token, which would make exactness tests prove little.
        initializer_range=0.1,
    )
    config_cls, extra = _ARCH_CONFIGS[arch]
    extra = dict(extra)
    if "layer_types" in extra:  # alternate sliding-window and global layers, as Gemma 2/3 do
        extra["layer_types"] = [extra["layer_types"][i % 2] for i in range(layers)]
    if arch == "qwen3_moe":  # experts narrower than the dense MLP, as in the real models
        extra["moe_intermediate_size"] = intermediate // 2
    return getattr(transformers, config_cls)(**{**common, **extra})


_ALTERNATING = ("sliding_attention", "full_attention")
# arch -> (config class, settings beyond `common`). Sliding windows are a few tokens wide, and
# soft-caps low, so tests' short prompts exercise them (real models use 4096 and 50/30).
_ARCH_CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": 4096}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {}),
    "gemma2": (
        "Gemma2Config",
        {
            "sliding_window": 5,
            "layer_types": _ALTERNATING,
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 3.0,
            "query_pre_attn_scalar": 32,
        },
    ),
    "gemma3": (
        "Gemma3TextConfig",
        {
            "sliding_window": 5,
            "layer_types": _ALTERNATING,
            "final_logit_softcapping": 3.0,
            "query_pre_attn_scalar": 32,
        },
    ),
    "phi3": ("Phi3Config", {}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # layer 1 dense: a peer serving [1:...) must renumber `mlp_only_layers` (swarm/models/architectures.py)
    "qwen3_moe": ("Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [1]}),
}


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TOKENIZER_CORPUS.split("\n"), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
