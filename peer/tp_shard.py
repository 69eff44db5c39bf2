"""One tensor-parallel rank's share of a decoder layer: which slice of each weight it holds.

Megatron-style splitting (HexGen §3.2 uses it inside a stage), driven by the model config's
own `base_model_tp_plan` from transformers (Llama, Mistral and Qwen2 all ship one):

- "colwise" (q/k/v, gate/up): rank r keeps rows [r·n/K, (r+1)·n/K) of the weight and bias.
  For q/k/v that is whole heads, so each rank runs attention over its own heads, and GQA
  stays intact: query head i uses KV head i // (heads / kv_heads), which lands on the
  same rank when K divides both head counts. The KV cache is thereby split by KV heads.
- "rowwise" (o_proj, down_proj): rank r keeps columns [r·n/K, (r+1)·n/K) of the weight,
  so its output is a partial sum; an all-reduce after the layer gives every rank the full
  result. A bias would be added K times, so only rank 0 keeps it (others hold zeros).
- Everything else (the RMSNorms) is replicated.

The layers themselves are transformers' own classes, built against `shard_config` (a config
with 1/K of the heads and of the MLP width) so their shapes match the shards.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable

import torch
from torch import nn
from transformers import PretrainedConfig

AllReduce = Callable[[torch.Tensor], None]  # sums a tensor in place over the group


class TPDegreeError(ValueError):
    """The model cannot be split K ways."""


def check_degree(config: PretrainedConfig, tp: int) -> None:
    """Raises TPDegreeError naming the first count that `tp` does not divide."""
    if tp < 1:
        raise TPDegreeError(f"--tp must be at least 1, got {tp}")
    if tp == 1:
        return  # one rank holds whole layers: any family
    counts = {
        "attention heads": config.num_attention_heads,
        "KV heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        "MLP width (intermediate_size)": config.intermediate_size,
    }
    for what, n in counts.items():
        if n % tp:
            raise TPDegreeError(f"--tp {tp} does not divide the model's {n} {what}")
    _layer_plan(config)  # fails on a plan we do not know how to apply


def valid_degrees(config: PretrainedConfig, most: int) -> tuple[int, ...]:
    """The degrees up to `most` that split this model (what `--tp auto` offers the plan)."""
    degrees = []
    for tp in range(1, most + 1):
        try:
            check_degree(config, tp)
        except TPDegreeError:
            continue
        degrees.append(tp)
    return tuple(degrees)


def shard_config(config: PretrainedConfig, tp: int) -> PretrainedConfig:
    """A copy of `config` whose layers have 1/tp of the heads and of the MLP width."""
    local = copy.deepcopy(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    local.head_dim = head_dim  # keep it: hidden_size // (heads / tp) would be wrong
    local.num_attention_heads = config.num_attention_heads // tp
    local.num_key_value_heads = (
        getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    ) // tp
    local.intermediate_size = config.intermediate_size // tp
    return local


def _layer_plan(config: PretrainedConfig) -> dict[str, str]:
    """'self_attn.q_proj' -> 'colwise' | 'rowwise', from the config's base_model_tp_plan."""
    plan = getattr(config, "base_model_tp_plan", None) or {}
    layer_plan = {}
    for pattern, style in plan.items():
        if not pattern.startswith("layers.*.") or style.startswith("replicated"):
            continue  # e.g. Qwen3's q/k norms: whole on every rank, like the RMSNorms
        if style not in ("colwise", "rowwise"):
            raise TPDegreeError(
                f"{config.model_type} cannot be split with --tp: its tensor-parallel style {style!r} "
                f"of {pattern} is not supported"
            )
        layer_plan[pattern.removeprefix("layers.*.")] = style
    if not layer_plan:
        raise TPDegreeError(f"{config.model_type} has no tensor-parallel plan in its config")
    return layer_plan


class ShardPlan:
    """Which part of each layer tensor rank `rank` of `tp` reads."""

    def __init__(self, config: PretrainedConfig, rank: int, tp: int):
        self.rank, self.tp = rank, tp
        self.layer_plan = _layer_plan(config)

    def style(self, name: str) -> str | None:
        """'colwise', 'rowwise' or None (replicated) for a tensor name like
        'model.layers.3.self_attn.q_proj.weight'."""
        module = name.rsplit(".", 1)[0]
        for pattern, style in self.layer_plan.items():
            if fnmatch.fnmatch(module, f"*.{pattern}"):
                return style
        return None

    def slice_of(self, name: str, shape: list[int]) -> tuple[slice, ...] | None:
        """The rank's part of a tensor (for `load_tensors`); None reads it whole."""
        style, is_weight = self.style(name), name.endswith(".weight")
        if style == "colwise":
            return (self._chunk(shape[0], name),)
        if style == "rowwise" and is_weight:
            return (slice(None), self._chunk(shape[1], name))
        return None  # replicated tensors, and row-parallel biases (see `finish`)

    def finish(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A row-parallel bias counts once in the all-reduced sum: only rank 0 keeps it."""
        if self.rank != 0 and self.style(name) == "rowwise" and name.endswith(".bias"):
            return torch.zeros_like(tensor)
        return tensor

    def _chunk(self, n: int, name: str) -> slice:
        if n % self.tp:
            raise TPDegreeError(f"{name}: {n} rows do not split into {self.tp} equal parts")
        size = n // self.tp
        return slice(self.rank * size, (self.rank + 1) * size)


def all_reduce_after_row_parallel(layer: nn.Module, plan: ShardPlan, all_reduce: AllReduce) -> None:
    """Sums the partial outputs of the layer's row-parallel modules over the group."""

    def hook(_module, _inputs, output):
        all_reduce(output)
        return output

    for module_name, module in layer.named_modules():
        if module_name and plan.style(f"x.{module_name}.weight") == "rowwise":
            module.register_forward_hook(hook)
