"""Debug-only behaviours for tests of the client's defences; never for a real swarm."""

from __future__ import annotations

import json

import msgpack
import torch


class CorruptOutputs:
    """Wraps a peer's Blocks so that every output carries noise (run-peer
    --debug-corrupt-outputs): a stand-in for a buggy or malicious peer, which client-side
    verification (client/verify.py) must catch. Everything else is the wrapped Blocks'."""

    def __init__(self, blocks, scale: float = 0.05):
        self._blocks = blocks
        self._scale = scale

    def __getattr__(self, name: str):
        return getattr(self._blocks, name)

    def __call__(self, hidden: torch.Tensor, cache, position: int, start: int, end: int) -> torch.Tensor:
        output = self._blocks(hidden, cache, position, start, end)
        return output + self._scale * output.std() * torch.randn_like(output)

    def forward_batch(self, hiddens, caches, positions, start: int, end: int) -> list[torch.Tensor]:
        outputs = self._blocks.forward_batch(hiddens, caches, positions, start, end)
        return [out + self._scale * out.std() * torch.randn_like(out) for out in outputs]


def parse_record_override(text: str) -> tuple[str, object]:
    """'throughput=NaN' -> ('throughput', nan): a field of the announced record and a JSON value
    (run-peer --debug-record), for tests of what readers do with a hostile peer's record."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise ValueError(f"--debug-record takes FIELD=JSON, got {text!r}")
    return name, json.loads(value)


def tampered_encoder(overrides: dict[str, object]):
    """A record encoder that writes `overrides` over the honest fields, signed as usual: the
    peer then announces values no honest peer would (NaN throughput, negative counts...)."""

    def encode(record) -> bytes:
        body = msgpack.unpackb(record.to_bytes(), raw=False)
        body.update(overrides)
        return msgpack.packb(body, use_bin_type=True)

    return encode
