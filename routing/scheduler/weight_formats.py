"""The weight formats a peer may serve a model's blocks in, and what each costs in memory.

A block's linear layers (attention projections and MLP) hold almost all of its weights; they
are what a quantized peer stores in fewer bytes. Norms and biases stay in the compute dtype,
and so do the embeddings and the LM head, which clients hold, not peers.

- `none`: the compute dtype (float32: 4 bytes a weight, float16/bfloat16: 2);
- `int8`: one byte a weight and a scale per output row (per-channel symmetric int8);
- `nf4`: 4-bit NormalFloat (QLoRA, Dettmers et al. 2023, §3) in blocks of 64 weights, each
  block's absmax quantized again to 8 bits ("double quantization", §3), about 0.52 bytes a
  weight.

Plain data: the scheduler's memory model (HexGen §4.1, Eq. 7) reads it, and so do the peer and
the records that announce a peer's format.
"""

from __future__ import annotations

from collections.abc import Sequence

QUANT_FORMATS = ("none", "int8", "nf4")
DEFAULT_QUANT = "none"

# Bytes per linear weight beyond the packed data: int8 keeps a 2-byte scale per output row
# (rows are at least ~500 weights wide in any model worth quantizing); nf4 keeps one 8-bit
# absmax per 64-weight block plus a float32 constant per 256 blocks.
_QUANTIZED_BYTES_PER_WEIGHT = {
    "int8": 1.0 + 2.0 / 512,
    "nf4": 0.5 + 1.0 / 64 + 4.0 / (64 * 256),
}


class UnknownQuantError(ValueError):
    """A weight format that is not one of QUANT_FORMATS."""


def check_quant(quant: str) -> str:
    """`quant` if it is a known format; UnknownQuantError naming the known ones otherwise."""
    if quant not in QUANT_FORMATS:
        raise UnknownQuantError(
            f"unknown weight format {quant!r}; the formats are {', '.join(QUANT_FORMATS)}"
        )
    return quant


def bytes_per_weight(quant: str, dtype_bytes: float) -> float:
    """Bytes one linear weight takes in `quant`, for a peer computing in `dtype_bytes`-byte floats."""
    check_quant(quant)
    return float(dtype_bytes) if quant == "none" else _QUANTIZED_BYTES_PER_WEIGHT[quant]


def accepted_formats(quant: str | Sequence[str]) -> tuple[str, ...]:
    """The weight formats a client named (one or several), checked; ValueError names the known ones."""
    names = (quant,) if isinstance(quant, str) else tuple(quant)
    if not names:
        raise ValueError(f"quant must name at least one weight format of {', '.join(QUANT_FORMATS)}")
    for name in names:
        check_quant(name)
    return tuple(dict.fromkeys(names))
