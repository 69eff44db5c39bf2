"""The inputs of Hepti's partitioning engine as plain data, and the step time of a split.

Hepti §4.3 takes, per device, its compute speed f_i, its free memory s_i and its bandwidth
BW_i, and per block b of a transformer layer the shapes of its matrix products. Here a block is
one of the two halves a tensor-parallel peer splits (Megatron's split, as `--tp K` does):

- attention, split by KV-head groups: a group is one KV head with the query heads that share it
  (heads / kv_heads of them), with their slices of W_q, W_k, W_v (R column-wise) and W_o
  (block-wise, the rows that match those heads);
- the MLP, split by column tiles of `tile` columns: their columns of W_gate and W_up and the
  matching rows of W_down.

`step_time` is Eq. 5-7 for integer shares, the oracle that the LP (lp.py) is checked against:
per block, the slowest device's compute (Eq. 5: its FLOPs / its speed) plus the block's
communication, which Eq. 6 sums over the devices that take part (their links to the leader
carry one after the other). Times are per decode step, for all the layers the peer serves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GROUP, TILE = "attention", "mlp"


@dataclass(frozen=True)
class Device:
    """One rank as profiled (Hepti §4.3's f_i, s_i, BW_i); the first device of a group is the
    leader, whose link figures are not used (it holds the step already)."""

    name: str
    flops: float  # f_i: sustained FLOP/s (a relative speed works if every device uses the same unit)
    free_bytes: float  # s_i: memory free for this rank's weights
    bandwidth: float = math.inf  # bytes/s of its link to the leader
    latency_s: float = 0.0  # one-way latency of that link

    def __post_init__(self) -> None:
        if not self.flops > 0 or not self.bandwidth > 0:
            raise ValueError(f"device {self.name!r}: flops and bandwidth must be positive")
        if self.free_bytes < 0 or self.latency_s < 0:
            raise ValueError(f"device {self.name!r}: free_bytes and latency_s must not be negative")


@dataclass(frozen=True)
class LayerShape:
    """One decoder layer's shapes, and how many such layers the peer serves."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    dtype_bytes: int = 2
    num_layers: int = 1
    gated_mlp: bool = True  # gate/up/down (Llama); False: fc1/fc2 (OPT)

    def __post_init__(self) -> None:
        sizes = (self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim)
        if min(*sizes, self.intermediate_size, self.dtype_bytes, self.num_layers) <= 0:
            raise ValueError("layer shape: every size must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.num_heads} heads do not split into {self.num_kv_heads} KV-head groups")

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], num_layers: int | None = None) -> LayerShape:
        """Reads a Hugging Face `config.json` dict (Llama, Mistral, Qwen2, OPT, ...)."""
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            width = int(config.get("intermediate_size") or config["ffn_dim"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"config lacks hidden_size / num_attention_heads / intermediate_size: {exc}"
            ) from exc
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float16")
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=width,
            dtype_bytes=4 if dtype in ("float32", "float") else 2,
            num_layers=int(num_layers or config.get("num_hidden_layers") or 1),
            gated_mlp=config.get("model_type")
            not in ("opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon", "phi"),
        )


@dataclass(frozen=True)
class HeptiProblem:
    """A group of ranks and the layers they split: everything P2 needs (Hepti §4.3)."""

    devices: tuple[Device, ...]
    shape: LayerShape
    tokens: int = 1  # tokens per step (m in §4.3): the batch's new tokens
    tile: int = 64  # MLP columns per tile; the largest divisor of the width up to this is used
    # Every device takes at least one unit of each block: a live tensor-parallel rank builds
    # transformers' layers for its share, and a layer cannot have zero heads or columns.
    every_device: bool = False

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("a Hepti group needs at least one device")
        if len({d.name for d in self.devices}) != len(self.devices):
            raise ValueError("device names must be unique")
        if self.tokens <= 0 or self.tile <= 0:
            raise ValueError("tokens and tile must be positive")
        if self.every_device and len(self.devices) > min(self.groups, self.tiles):
            raise ValueError(
                f"{len(self.devices)} devices cannot each take one of {self.groups} KV-head groups"
            )

    @property
    def least_units(self) -> int:
        """The fewest units of a block a device may take (Eq. 2's lower bound)."""
        return 1 if self.every_device else 0

    @property
    def groups(self) -> int:
        """KV-head groups to split (Eq. 1's whole, attention)."""
        return self.shape.num_kv_heads

    @property
    def tile_width(self) -> int:
        """Columns per MLP tile: the largest divisor of the MLP width that is at most `tile`."""
        width = self.shape.intermediate_size
        return max(w for w in range(1, min(self.tile, width) + 1) if width % w == 0)

    @property
    def tiles(self) -> int:
        """MLP column tiles to split (Eq. 1's whole, MLP)."""
        return self.shape.intermediate_size // self.tile_width

    def flops(self, block: str) -> float:
        """FLOPs of one unit (a KV-head group or an MLP tile) over all layers, one step (Eq. 3, 2 per MAC)."""
        s, t = self.shape, self.tokens
        if block == GROUP:  # Q and O: heads_per_group heads; K and V: one head
            return 2.0 * t * s.hidden_size * s.head_dim * (2 * s.heads_per_group + 2) * s.num_layers
        return 2.0 * t * s.hidden_size * self.tile_width * (3 if s.gated_mlp else 2) * s.num_layers

    def weight_bytes(self, block: str) -> float:
        """Bytes of one unit's weights over all layers (what Eq. 4 bounds by s_i)."""
        return self.flops(block) / (2.0 * self.tokens) * self.shape.dtype_bytes

    def comm_s(self, i: int) -> float:
        """Eq. 6's T'_bi: one block's all-reduce through the leader for device i, per step over all
        layers: its partial sum up and the sum back (tokens x hidden each), plus two latencies."""
        if i == 0:
            return 0.0
        d = self.devices[i]
        activations = self.tokens * self.shape.hidden_size * self.shape.dtype_bytes
        return (2 * activations / d.bandwidth + 2 * d.latency_s) * self.shape.num_layers

    def memory_fits(self, i: int, groups: float, tiles: float) -> bool:
        """Eq. 4 for device i: its share's weights within its free memory."""
        need = groups * self.weight_bytes(GROUP) + tiles * self.weight_bytes(TILE)
        return need <= self.devices[i].free_bytes * (1 + 1e-9)

    def split_fits(self, groups: list[int], tiles: list[int]) -> bool:
        """Eq. 4 for every device."""
        return all(self.memory_fits(i, g, c) for i, (g, c) in enumerate(zip(groups, tiles, strict=True)))

    def step_time(self, groups: list[int], tiles: list[int]) -> tuple[float, float, float]:
        """Eq. 7 for integer shares: (T, attention time, MLP time). A device with no share of a
        block takes no part in it and adds nothing to that block's communication."""
        attention = self.block_time(GROUP, groups)
        mlp = self.block_time(TILE, tiles)
        return attention + mlp, attention, mlp

    def block_time(self, block: str, shares: list[int]) -> float:
        """max_i(T^c_bi) + T^x_b (Eq. 5-7) of one block."""
        comm = sum(self.comm_s(i) for i, share in enumerate(shares) if share)
        return (
            max(share * self.flops(block) / d.flops for share, d in zip(shares, self.devices, strict=True))
            + comm
        )
