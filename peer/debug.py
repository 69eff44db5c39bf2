"""Debug-only behaviours for tests of the client's defences; never for a real swarm."""

from __future__ import annotations

import json
import logging
import random
import time

import msgpack
import torch

from hexswarm.peer.flags import LIES

logger = logging.getLogger(__name__)


class CorruptOutputs:
    """Wraps a peer's Blocks so that its outputs are wrong in one of the LIES ways (run-peer
    --debug-corrupt-outputs MODE): a stand-in for a buggy or malicious peer, which client-side
    verification (client/verify.py) must catch. Everything else is the wrapped Blocks'."""

    def __init__(self, blocks, mode: str = "noise5", seed: int = 0):
        if mode not in LIES:
            raise ValueError(f"unknown lie {mode!r}; one of {sorted(LIES)}")
        self._blocks, self._mode = blocks, mode
        self._rng = random.Random(seed)
        if mode in ("skip-layer", "finetune"):
            tamper(blocks, mode)

    def __getattr__(self, name: str):
        return getattr(self._blocks, name)

    def __call__(self, hidden: torch.Tensor, cache, position: int, start: int, end: int) -> torch.Tensor:
        return self._lie(self._blocks(hidden, cache, position, start, end))

    def forward_batch(self, hiddens, caches, positions, start: int, end: int) -> list[torch.Tensor]:
        return [self._lie(out) for out in self._blocks.forward_batch(hiddens, caches, positions, start, end)]

    def _lie(self, output: torch.Tensor) -> torch.Tensor:
        if self._mode == "noise5":
            return output + 0.05 * output.std() * torch.randn_like(output)
        if self._mode == "noise" or (self._mode == "sometimes" and self._rng.random() < 1 / 20):
            rms = output.float().pow(2).mean(dim=-1, keepdim=True).sqrt()
            return output + (0.01 * rms * torch.randn_like(output, dtype=torch.float32)).to(output.dtype)
        return output


class SlowBlocks:
    """Wraps a peer's Blocks so that every forward takes `ms` longer (run-peer --debug-slow-ms),
    on the compute thread: a peer slower than it announces, which clients must see through
    (client/observed.py)."""

    def __init__(self, blocks, ms: float):
        self._blocks, self._s = blocks, ms / 1000

    def __getattr__(self, name: str):
        return getattr(self._blocks, name)

    def __call__(self, hidden: torch.Tensor, cache, position: int, start: int, end: int) -> torch.Tensor:
        time.sleep(self._s)
        return self._blocks(hidden, cache, position, start, end)

    def forward_batch(self, hiddens, caches, positions, start: int, end: int) -> list[torch.Tensor]:
        time.sleep(self._s)
        return self._blocks.forward_batch(hiddens, caches, positions, start, end)


def with_debug_faults(blocks, corrupt_outputs: str, slow_ms: float):
    """`blocks`, wrapped to compute wrong (`--debug-corrupt-outputs`) or slowly
    (`--debug-slow-ms`) when a test's hidden flag asks; else `blocks` itself."""
    if corrupt_outputs:
        logger.warning(
            "--debug-corrupt-outputs %s: this peer computes WRONG outputs on purpose", corrupt_outputs
        )
        blocks = CorruptOutputs(blocks, corrupt_outputs)
    if slow_ms:
        blocks = SlowBlocks(blocks, slow_ms)
    return blocks


def tamper(blocks, mode: str) -> None:
    """Changes the middle block of a BlockStack's range in place: skipped, or its weights perturbed."""
    middle = len(blocks.layers) // 2
    if mode == "skip-layer":
        blocks.layers[middle] = _Skip()
        return
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in blocks.layers[middle].parameters():
            if param.is_floating_point() and param.ndim == 2:
                rms = param.float().pow(2).mean().sqrt()
                noise = torch.randn(param.shape, generator=generator) * 0.01 * rms
                param.add_(noise.to(param.dtype))


class _Skip(torch.nn.Module):
    def forward(self, hidden, **kwargs):
        return hidden


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
