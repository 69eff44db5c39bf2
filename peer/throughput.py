"""Measures how fast this peer's blocks run, once per model shape and device, cached on disk.

Three figures go into the peer's record: batched-prefill throughput (tokens/s through one
block), the latency of a one-token decode step through one block (ms), and the decode
throughput (tokens/s through one block) when DECODE_BATCH sessions step together, as the
peer's scheduler batches them (peer/scheduler.py). Routers use them to estimate a chain's
latency and capacity.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hexswarm.peer.core import Blocks
from hexswarm.swarm.tools import log_setup
from hexswarm.swarm.tools.threads import torch_threads

logger = logging.getLogger(__name__)

PREFILL_TOKENS = 128
DECODE_STEPS = 8
# Blocks timed: the figures are per block, and timing the whole range of a big peer (32 blocks
# of a 7B model) would only delay its start. Two, so that per-step work shared by a hop's blocks
# (masks, rotary embeddings) weighs as it does on a short range rather than vanishing.
MEASURE_BLOCKS = 2
DECODE_BATCH = 8  # sessions in the batched-decode measurement
BATCH_CONTEXT = 16  # tokens already cached in each of them


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: float  # per block, batched prefill
    decode_ms_per_block: float
    decode_batch_size: int = 1  # sessions the next figure was measured with (1: the peer does not batch)
    decode_batch_tokens_per_s: float = 0.0  # per block, decode steps of decode_batch_size sessions at once


def cache_path() -> Path:
    base = os.environ.get("HEXSWARM_CACHE_DIR") or Path.home() / ".cache" / "hexswarm"
    return Path(base) / "throughput.json"


def measure_or_load(blocks: Blocks, prefill_threads: int | None = None) -> Throughput:
    """Returns cached figures for this block shape/dtype/device and tensor-parallel degree,
    measuring them if absent. A group is measured through all its ranks, collectives included.
    `prefill_threads`: the torch threads the peer runs prefill steps on (peer/core.py)."""
    key = cache_key(blocks, prefill_threads)
    path = cache_path()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if key in cached:
        try:
            return Throughput(**cached[key])
        except TypeError:  # written by another version: measure again
            pass
    logger.info("measuring throughput of [%d:%d) (cached afterwards in %s)", blocks.start, blocks.end, path)
    figures = measure(blocks, prefill_threads)
    cached[key] = figures.__dict__
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cached, indent=1))
    except OSError as e:
        logger.warning("could not cache throughput in %s: %s", path, e)
    return figures


def cache_key(blocks: Blocks, prefill_threads: int | None = None) -> str:
    """Everything the figures depend on: the layer's shape, dtype, weight format (an int8 peer
    runs several times faster than a float32 one on this CPU), device, threads, tensor-parallel
    degree, batching, and the torch version that runs it."""
    c = blocks.config  # on a tensor-parallel group: one rank's share of a layer
    threads = torch.get_num_threads()
    return (
        f"{blocks.spec.model_type}-h{c.hidden_size}-i{c.intermediate_size}-a{c.num_attention_heads}"
        f"-kv{c.num_key_value_heads}-{blocks.dtype}-q{getattr(blocks, 'quant', 'none')}-{blocks.device}"
        f"-t{threads}-p{prefill_threads or threads}-tp{blocks.tp}-b{DECODE_BATCH if _batches(blocks) else 1}"
        f"-torch{torch.__version__}"
    )


def measure(blocks: Blocks, prefill_threads: int | None = None) -> Throughput:
    """Times a prefill of PREFILL_TOKENS and the median of DECODE_STEPS one-token steps through
    the first MEASURE_BLOCKS blocks."""
    span = (blocks.start, min(blocks.end, blocks.start + MEASURE_BLOCKS))
    n_blocks = span[1] - span[0]
    hidden = torch.randn(
        1, PREFILL_TOKENS + DECODE_STEPS, blocks.spec.hidden_size, dtype=blocks.dtype, device=blocks.device
    )
    steps = 2 * (1 + DECODE_STEPS)  # warm-up and measured run: a prefill and the decode steps each
    with log_setup.progress(total=steps, desc=f"measuring [{span[0]}:{span[1]})", unit="step") as bar:
        # first calls pay for allocations and kernel setup
        _run(blocks, hidden, span, "measure-warm-up", bar, prefill_threads)
        prefill_s, decode_s = _run(blocks, hidden, span, "measure", bar, prefill_threads)
    batch, batch_step_s = (DECODE_BATCH, _batched_step(blocks, span)) if _batches(blocks) else (1, decode_s)
    return Throughput(
        tokens_per_s=PREFILL_TOKENS * n_blocks / prefill_s,
        decode_ms_per_block=1000 * decode_s / n_blocks,
        decode_batch_size=batch,
        decode_batch_tokens_per_s=batch * n_blocks / batch_step_s,
    )


def _batches(blocks: Blocks) -> bool:
    return bool(getattr(blocks, "supports_batching", False))


def _batched_step(blocks: Blocks, span: tuple[int, int]) -> float:
    """Median seconds of a decode step of DECODE_BATCH sessions run as one batch."""
    names = [f"measure-batch-{i}" for i in range(DECODE_BATCH)]
    caches = [blocks.new_cache(name) for name in names]
    shape = (1, BATCH_CONTEXT + 1 + DECODE_STEPS, blocks.spec.hidden_size)
    hidden = torch.randn(shape, dtype=blocks.dtype, device=blocks.device)
    try:
        for cache in caches:
            blocks(hidden[:, :BATCH_CONTEXT], cache, 0, *span)
        steps = []
        for i in range(BATCH_CONTEXT, BATCH_CONTEXT + 1 + DECODE_STEPS):  # the first one warms up
            began = time.perf_counter()
            token = [hidden[:, i : i + 1]] * DECODE_BATCH
            blocks.forward_batch(token, caches, [i] * DECODE_BATCH, *span)
            _sync(blocks.device)
            steps.append(time.perf_counter() - began)
        return statistics.median(steps[1:])
    finally:
        for name in names:
            blocks.release(name)


def _run(
    blocks: Blocks,
    hidden: torch.Tensor,
    span: tuple[int, int],
    session_id: str,
    bar,
    prefill_threads: int | None,
) -> tuple[float, float]:
    """(prefill seconds, median decode-step seconds) in a throwaway session."""
    cache = blocks.new_cache(session_id)
    try:
        return _time_steps(blocks, hidden, span, cache, bar, prefill_threads)
    finally:
        blocks.release(session_id)


def _time_steps(
    blocks: Blocks, hidden: torch.Tensor, span: tuple[int, int], cache, bar, prefill_threads: int | None
) -> tuple[float, float]:
    began = time.perf_counter()
    with torch_threads(prefill_threads):  # as peer/core.py runs a prefill
        blocks(hidden[:, :PREFILL_TOKENS], cache, 0, *span)
    _sync(blocks.device)
    prefill_s = time.perf_counter() - began
    bar.update()
    steps = []
    for i in range(PREFILL_TOKENS, PREFILL_TOKENS + DECODE_STEPS):
        began = time.perf_counter()
        blocks(hidden[:, i : i + 1], cache, i, *span)
        _sync(blocks.device)
        steps.append(time.perf_counter() - began)
        bar.update()
    return prefill_s, statistics.median(steps)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
