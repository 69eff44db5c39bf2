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

An uneven split (`--partition auto`, Hepti §4.3; the shares come from peer/tp/partition.py) is a
`Partition`: how many KV-head groups (a KV head with the query heads that share it) and MLP
columns each rank computes. The slices are then contiguous runs of those units, in rank order,
so GQA stays intact on every rank however the heads are shared out.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, PretrainedConfig

AllReduce = Callable[[torch.Tensor], None]  # sums a tensor in place over the group


class TPDegreeError(ValueError):
    """The model cannot be split K ways."""


@dataclass(frozen=True)
class Partition:
    """Each rank's share of every layer: KV-head groups and MLP columns, rank 0 first."""

    kv_groups: tuple[int, ...]
    mlp_columns: tuple[int, ...]

    @property
    def tp(self) -> int:
        return len(self.kv_groups)

    def check(self, config: PretrainedConfig) -> None:
        """TPDegreeError unless the shares are positive and add up to the model's counts."""
        kv_heads, width = _kv_heads(config), config.intermediate_size
        if len(self.mlp_columns) != self.tp or self.tp < 1:
            raise TPDegreeError("a partition needs one share of heads and of columns per rank")
        if min(self.kv_groups) < 1 or min(self.mlp_columns) < 1:
            raise TPDegreeError(f"every rank needs at least one KV head and one MLP column: {self}")
        if sum(self.kv_groups) != kv_heads or sum(self.mlp_columns) != width:
            raise TPDegreeError(
                f"shares {self.kv_groups} / {self.mlp_columns} do not add up to the model's "
                f"{kv_heads} KV heads / {width} MLP columns"
            )

    def heads(self, config: PretrainedConfig) -> tuple[int, ...]:
        """Query heads per rank."""
        per_group = config.num_attention_heads // _kv_heads(config)
        return tuple(g * per_group for g in self.kv_groups)


def even_partition(config: PretrainedConfig, tp: int) -> Partition:
    """`--tp K`'s split as a Partition (K must divide the counts: check_degree)."""
    return Partition((_kv_heads(config) // tp,) * tp, (config.intermediate_size // tp,) * tp)


def _kv_heads(config: PretrainedConfig) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def check_degree(config: PretrainedConfig, tp: int) -> None:
    """Raises TPDegreeError naming the first count that `tp` does not divide."""
    if tp < 1:
        raise TPDegreeError(f"--tp must be at least 1, got {tp}")
    if tp == 1:
        return  # one rank holds whole layers: any family
    counts = {
        "attention heads": config.num_attention_heads,
        "KV heads": _kv_heads(config),
        "MLP width (intermediate_size)": config.intermediate_size,
    }
    for what, n in counts.items():
        if n % tp:
            raise TPDegreeError(f"--tp {tp} does not divide the model's {n} {what}")
    _layer_plan(config)  # fails on a plan we do not know how to apply


def check_uneven_degree(config: PretrainedConfig, tp: int) -> None:
    """An uneven split (`--partition auto`) needs no divisor, only a KV head for every rank."""
    if tp < 2:
        raise TPDegreeError("--partition auto splits a group of at least 2 ranks")
    if tp > _kv_heads(config):
        raise TPDegreeError(f"--tp {tp}: the model's {_kv_heads(config)} KV heads cannot give every rank one")
    _layer_plan(config)


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


def shard_config(
    config: PretrainedConfig, tp: int, partition: Partition | None = None, rank: int = 0
) -> PretrainedConfig:
    """A copy of `config` whose layers have rank `rank`'s share of the heads and of the MLP
    width: 1/tp of each, or what `partition` gives it."""
    partition = partition or even_partition(config, tp)
    local = copy.deepcopy(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    local.head_dim = head_dim  # keep it: hidden_size // (heads / tp) would be wrong
    local.num_attention_heads = partition.heads(config)[rank]
    local.num_key_value_heads = partition.kv_groups[rank]
    local.intermediate_size = partition.mlp_columns[rank]
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
    if getattr(config, "num_local_experts", 0) or getattr(config, "num_experts", 0):
        # Recent transformers list only attention (or a dense MLP's names) in a mixture-of-experts
        # model's plan: whole experts on every rank would be summed K times by the all-reduce
        raise TPDegreeError(
            f"{config.model_type} cannot be split with --tp: its mixture-of-experts layers are not supported"
        )
    return layer_plan


class ShardPlan:
    """Which part of each layer tensor rank `rank` of `tp` reads: 1/tp of it, or the rank's
    share of `partition` (an uneven split)."""

    def __init__(self, config: PretrainedConfig, rank: int, tp: int, partition: Partition | None = None):
        self.rank, self.tp = rank, tp
        self.layer_plan = _layer_plan(config)
        self.partition = partition
        self._config = config
        if partition is not None:
            if partition.tp != tp:
                raise TPDegreeError(f"a partition of {partition.tp} ranks for a group of {tp}")
            partition.check(config)

    def partition_or_even(self) -> Partition:
        """The split this plan reads: its partition, or 1/tp of everything."""
        return self.partition or even_partition(self._config, self.tp)

    def local_config(self, config: PretrainedConfig) -> PretrainedConfig:
        """The config this rank's layers are built against (their shapes match its slices)."""
        return shard_config(config, self.tp, self.partition, self.rank)

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
        shares = self._shares(name)
        if n % sum(shares):
            raise TPDegreeError(f"{name}: {n} rows do not split into {sum(shares)} equal units")
        unit = n // sum(shares)
        first = sum(shares[: self.rank])
        return slice(first * unit, (first + shares[self.rank]) * unit)

    def _shares(self, name: str) -> tuple[int, ...]:
        """Units per rank of the tensor's half of the layer: KV-head groups for attention (a
        q/o slice of a group is its query heads, a k/v slice its KV head), columns for the MLP."""
        if self.partition is None:
            return (1,) * self.tp
        return self.partition.kv_groups if ".self_attn." in name else self.partition.mlp_columns


def all_reduce_after_row_parallel(layer: nn.Module, plan: ShardPlan, all_reduce: AllReduce) -> None:
    """Sums the partial outputs of the layer's row-parallel modules over the group."""

    def hook(_module, _inputs, output):
        all_reduce(output)
        return output

    for module_name, module in layer.named_modules():
        if module_name and plan.style(f"x.{module_name}.weight") == "rowwise":
            module.register_forward_hook(hook)


Sessions = tuple[tuple[str, tuple[tuple[int, int, int], ...]], ...]  # (id, its filled layers)


def resplit_sessions(
    old_stack,
    new_stack,
    sessions: Sessions,
    caches: dict[str, DynamicCache],
    rank: int,
    all_reduce: AllReduce,
) -> dict[str, DynamicCache]:
    """The caches of `sessions` moved from `old_stack`'s split to `new_stack`'s (two BlockStacks
    of the same blocks on this rank), for the sessions this rank holds in `caches`. Collective:
    every rank of the group calls it with the same `sessions` (see `_resplit_cache`)."""
    old, new = old_stack.shard.partition_or_even(), new_stack.shard.partition_or_even()
    like = torch.empty(0, old_stack.config.head_dim, dtype=old_stack.dtype, device=old_stack.device)
    moved = {}
    for session_id, layers in sessions:
        cache = caches.get(session_id)
        template = new_stack.new_cache(session_id)
        result = _resplit_cache(cache, layers, old, new, rank, template, all_reduce, like)
        if cache is not None:
            moved[session_id] = result
    return moved


def _resplit_cache(
    cache: DynamicCache | None,
    layers: tuple[tuple[int, int, int], ...],
    old: Partition,
    new: Partition,
    rank: int,
    template: DynamicCache,
    all_reduce: AllReduce,
    like: torch.Tensor,
) -> DynamicCache:
    """This rank's share under `new` of a session's keys and values, from every rank's share
    under `old`: each filled layer is summed whole over the group (every rank adds its own KV
    heads into zeros) and the rank keeps the heads `new` gives it. Collective: every rank calls
    it with the same `layers` ((local layer, batch, length) of each filled layer) in the same
    order; a rank without the session (`cache` None) adds zeros. `template` is an empty cache of
    the new stack; `like` gives the dtype, device and head size."""
    old_first, new_first = sum(old.kv_groups[:rank]), sum(new.kv_groups[:rank])
    old_span = slice(old_first, old_first + old.kv_groups[rank])
    new_span = slice(new_first, new_first + new.kv_groups[rank])
    for index, batch, length in layers:
        whole = like.new_zeros((2, batch, sum(old.kv_groups), length, like.shape[-1]))
        if cache is not None:
            layer = cache.layers[index]
            whole[0, :, old_span], whole[1, :, old_span] = layer.keys, layer.values
        all_reduce(whole)
        layer = copy.copy(cache.layers[index] if cache is not None else template.layers[index])
        layer.keys, layer.values = whole[0, :, new_span].clone(), whole[1, :, new_span].clone()
        layer.is_initialized = True
        template.layers[index] = layer
    return template
