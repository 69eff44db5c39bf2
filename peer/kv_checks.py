"""The checks on keys and values a prefill peer pushes into a decode session (disaggregated
prefill and decode, HexGen-2 §3): what PeerCore.import_kv takes only after they pass."""

from __future__ import annotations

from typing import Protocol

import torch

from hexswarm.swarm.wire.protocol import ErrorCode, KvPush, ProtocolError
from hexswarm.swarm.wire.tensors import all_finite

# Keys and values a prefill peer pushes are refused beyond this magnitude: attention keys and
# values of real models stay within hundreds (SmolLM2's within 30), so larger values are poison.
MAX_KV_ABS = 1e4


class Receiving(Protocol):
    """What the checks read of the decode session (peer/core.py's Session)."""

    batch_size: int
    max_length: int
    prompt_length: int
    kv_imported: dict[int, int]  # layer -> tokens taken so far


def check_kv(session: Receiving, push: KvPush, config, dtype: torch.dtype) -> int:
    """The tokens of a valid KV_PUSH: its shape, dtype, length and values are what the
    session can hold."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    keys, values = push.keys, push.values
    layers, tokens = (keys.shape[0], keys.shape[3]) if keys.ndim == 5 else (0, 0)
    expected = (layers, session.batch_size, kv_heads, tokens, head_dim)
    if tuple(keys.shape) != expected or tuple(values.shape) != expected or min(layers, tokens) < 1:
        raise ProtocolError(
            ErrorCode.BAD_TENSOR,
            f"keys and values must be (layers>=1, batch={session.batch_size}, kv_heads={kv_heads}, "
            f"tokens>=1, head_dim={head_dim}), got {tuple(keys.shape)} and {tuple(values.shape)}",
        )
    if keys.dtype != dtype or values.dtype != dtype:
        raise ProtocolError(ErrorCode.BAD_TENSOR, f"keys and values must be {dtype}, got {keys.dtype}")
    if tokens > session.max_length:
        raise ProtocolError(
            ErrorCode.TOO_LONG,
            f"keys and values of {tokens} tokens exceed the session's reserved {session.max_length}",
        )
    if session.prompt_length and tokens != session.prompt_length:
        raise ProtocolError(
            ErrorCode.BAD_TENSOR,
            f"keys and values of {tokens} tokens pushed, the client's prompt has {session.prompt_length}",
        )
    if any(n != tokens for n in session.kv_imported.values()):
        raise ProtocolError(ErrorCode.BAD_TENSOR, f"layers of one prompt must have one length, got {tokens}")
    if not (all_finite(keys) and all_finite(values)):
        raise ProtocolError(ErrorCode.BAD_TENSOR, "keys or values contain NaN or inf")
    largest = max(float(keys.abs().max()), float(values.abs().max()))
    if largest > MAX_KV_ABS:
        raise ProtocolError(
            ErrorCode.BAD_TENSOR, f"keys or values reach {largest:.3g}, over the bound {MAX_KV_ABS:g}"
        )
    return tokens
