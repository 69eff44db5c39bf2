"""What differs between model families, found from each checkpoint's config, in one place.

Peers and clients build every family through transformers' own classes for it: the base
model class registered for the config (`AutoModel`), its decoder layer (the one class named
in `_no_split_modules`) and its rotary embedding. What the families add on top is read from
the config, never written out per family:

- per-layer attention kinds (`layer_types`: Gemma 2/3 alternate sliding-window and global
  layers; Mistral/Mixtral/Phi-3 use one sliding window or none for all layers);
- rotary embeddings per attention kind (Gemma 3's local and global layers use two bases);
- attention soft-capping (Gemma 2), which PyTorch's SDPA kernel cannot do: eager attention then;
- final-logit soft-capping (Gemma 2/3), applied by the client after the LM head;
- the embedding scale (Gemma): inside the family's own embedding module, so only its
  non-persistent buffer must be real (see `parameters_on_meta`);
- which layers have a mixture-of-experts MLP (Qwen3-MoE's `mlp_only_layers` and
  `decoder_sparse_step`), renumbered for a slice of the model in `localize_layer_settings`;
- expert weights stored one tensor per expert in checkpoints but fused in transformers'
  modules (Mixtral, Qwen3-MoE): converted with transformers' own checkpoint conversion
  mapping in `convert_checkpoint_tensors`.

Qwen3's q/k norms and Phi-3's fused qkv/gate_up projections need nothing here: they are
ordinary parameters of the families' own layer classes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # importing transformers costs ~0.7 s that `hexswarm status` need not pay
    from transformers import PretrainedConfig

# model_type -> family name, for families tested end to end through a 2-peer chain
# (tests/integration/test_architectures.py). Others may build, but are refused until tested.
SUPPORTED_FAMILIES: dict[str, str] = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3 (text)",
    "phi3": "Phi-3",
    "mixtral": "Mixtral (MoE)",
    "qwen3_moe": "Qwen3-MoE (MoE)",
}


class UnsupportedArchitectureError(ValueError):
    """The checkpoint's architecture is not one hexswarm serves."""


def check_supported(model_type: str | None, architectures: list[str] | None) -> None:
    """Raises UnsupportedArchitectureError naming the architecture and the supported ones
    (from config.json's fields, before transformers is asked to parse it)."""
    if model_type in SUPPORTED_FAMILIES:
        return
    architectures = ", ".join(architectures or []) or "no architectures listed"
    supported = ", ".join(f"{name} ({model_type})" for model_type, name in SUPPORTED_FAMILIES.items())
    raise UnsupportedArchitectureError(
        f"model type {model_type!r} ({architectures}) is not supported; supported: {supported}"
    )


def base_model_class(config: PretrainedConfig) -> type[nn.Module]:
    """The family's base model class (LlamaModel, Gemma3TextModel, ...)."""
    from transformers import AutoModel

    return AutoModel._model_mapping[type(config)]


def layer_classes(config: PretrainedConfig) -> tuple[type[nn.Module], type[nn.Module]]:
    """(decoder layer class, rotary embedding class) of the config's family."""
    base = base_model_class(config)
    module = importlib.import_module(base.__module__)
    layers = [name for name in base._no_split_modules if name.endswith("DecoderLayer")]
    if len(layers) != 1 or not hasattr(module, layers[0]):
        raise UnsupportedArchitectureError(f"{base.__name__} has no single decoder layer class: {layers}")
    rotary_name = layers[0].removesuffix("DecoderLayer") + "RotaryEmbedding"
    if not hasattr(module, rotary_name):
        raise UnsupportedArchitectureError(f"{base.__name__} has no {rotary_name}")
    return getattr(module, layers[0]), getattr(module, rotary_name)


def choose_implementations(config: PretrainedConfig) -> None:
    """Sets how `config`'s layers compute attention and experts, as its family allows.

    Attention: SDPA, or eager where the family needs attention soft-capping (Gemma 2), which
    SDPA cannot do. Mixture-of-experts: the plain per-expert loop ("eager"), which every
    device runs (transformers' grouped-matmul kernel is an optimisation left for later).
    """
    softcapped = getattr(config, "attn_logit_softcapping", None) is not None
    sdpa = base_model_class(config)._supports_sdpa and not softcapped
    config._attn_implementation = "sdpa" if sdpa else "eager"
    config._experts_implementation = "eager"


def layer_types(config: PretrainedConfig) -> list[str]:
    """'full_attention' or 'sliding_attention' per layer, as transformers' caches and masks see them."""
    explicit = getattr(config, "layer_types", None)
    if explicit is not None:
        return list(explicit)
    kind = "sliding_attention" if getattr(config, "sliding_window", None) is not None else "full_attention"
    return [kind] * config.num_hidden_layers


def localize_layer_settings(config: PretrainedConfig, local: PretrainedConfig, start: int, end: int) -> None:
    """Makes `local` (a copy of `config` for layers [start, end), indexed from 0) describe each
    layer as the full model does: per-layer lists are sliced, layer-index rules renumbered."""
    if getattr(config, "layer_types", None) is not None:
        local.layer_types = list(config.layer_types[start:end])
    if hasattr(config, "mlp_only_layers") and hasattr(config, "decoder_sparse_step"):
        # Qwen-MoE rule: layer i is dense if i is listed or (i + 1) is not a multiple of the step.
        dense = [
            i - start
            for i in range(start, end)
            if i in config.mlp_only_layers
            or not (getattr(config, "num_experts", 0) > 0 and (i + 1) % config.decoder_sparse_step == 0)
        ]
        local.mlp_only_layers, local.decoder_sparse_step = dense, 1


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Builds modules with their parameters on the meta device but real buffers.

    Parameters are filled from the checkpoint afterwards; buffers are not in checkpoints
    (rotary frequencies, Gemma's embedding scale), so they must be computed for real.
    """
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None:
            module._parameters[name] = nn.Parameter(
                module._parameters[name].to("meta"), requires_grad=param.requires_grad
            )

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def build_layers(config: PretrainedConfig, device: torch.device) -> tuple[nn.ModuleList, nn.Module]:
    """The decoder layers of `config` (parameters on meta, to be loaded) and its rotary embedding."""
    layer_cls, rotary_cls = layer_classes(config)
    with parameters_on_meta():
        layers = nn.ModuleList(layer_cls(config, i) for i in range(config.num_hidden_layers))
    return layers, rotary_cls(config=config).to(device)


def position_embeddings(
    rotary: nn.Module, hidden: torch.Tensor, position_ids: torch.Tensor, kinds: list[str]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(cos, sin) for each layer of `kinds`; computed once per attention kind where the family
    has one rotary base per kind (Gemma 3), else once for all."""
    if not takes_argument(type(rotary).forward, "layer_type"):
        shared = rotary(hidden, position_ids)
        return [shared] * len(kinds)
    by_kind = {kind: rotary(hidden, position_ids, kind) for kind in set(kinds)}
    return [by_kind[kind] for kind in kinds]


@functools.cache
def takes_argument(function, name: str) -> bool:
    """Whether `function` declares a parameter `name` (looked up once: a decode step calls it)."""
    return name in inspect.signature(function).parameters


@functools.cache
def cache_argument(function) -> str:
    """The name under which `function` (a decoder layer's forward, a mask maker) takes the KV
    cache: transformers 5 renamed `past_key_values` to `cache` (the old name goes in 5.40)."""
    return "cache" if takes_argument(function, "cache") else "past_key_values"


def final_logits(config: PretrainedConfig, logits: torch.Tensor) -> torch.Tensor:
    """The LM head's output as the family's own ForCausalLM returns it (Gemma's soft-capping)."""
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap


def convert_checkpoint_tensors(
    config: PretrainedConfig, tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Checkpoint tensors renamed and fused the way the family's modules hold them.

    Uses transformers' own conversion mapping for the model type (e.g. Mixtral's per-expert
    `block_sparse_moe.experts.N.w1/w3` become one `mlp.experts.gate_up_proj`). Families
    without a mapping come back unchanged.
    """
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    transforms = get_checkpoint_conversion_mapping(config.model_type) or []
    renamings = [t for t in transforms if type(t) is WeightRenaming]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    if len(renamings) + len(converters) != len(transforms):
        raise UnsupportedArchitectureError(
            f"{config.model_type}: checkpoint conversions {transforms} are not supported"
        )
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, tuple[WeightConverter, dict[str, list[torch.Tensor]]]] = {}
    for name in sorted(tensors, key=_natural_key):  # expert 2 before expert 10
        key = name
        for renaming in renamings:
            key, _ = renaming.rename_source_key(key)
        for converter in converters:
            target, pattern = converter.rename_source_key(key)
            if pattern is not None:
                collected = groups.setdefault(target, (converter, {}))[1]
                collected.setdefault(pattern, []).append(tensors[name])
                break
        else:
            out[key] = tensors[name]
    for target, (converter, collected) in groups.items():
        for op in converter.operations:
            collected = op.convert(
                collected,
                source_patterns=converter.source_patterns,
                target_patterns=converter.target_patterns,
            )
        (tensor,) = collected.values()
        out[target] = tensor
    return out


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
