"""The speeds a peer announces for a stack of blocks: measured once per shape and degree (and
cached, peer/throughput.py), or given by --throughput and --decode-ms."""

from __future__ import annotations

import asyncio
import logging

from hexswarm.peer.core import Blocks
from hexswarm.peer.throughput import measure_or_load
from hexswarm.peer.tp.group import TPGroupError
from hexswarm.swarm.wire.protocol import ProtocolError

logger = logging.getLogger(__name__)


async def announced_speed(config, blocks: Blocks) -> tuple[tuple[float, float], tuple[int, float]]:
    """What to announce for `blocks`: (prefill tokens/s, decode ms) per block and (sessions,
    tokens/s per block) of batched decode; measured once per shape and degree (cached).
    `config`: the peer's PeerConfig."""
    c = config
    throughput, decode_batch = (c.throughput or 0.0, c.decode_ms or 0.0), (1, 0.0)
    if c.throughput is None or c.decode_ms is None:
        try:  # through every rank of a group, collectives included
            figures = await asyncio.to_thread(measure_or_load, blocks, c.prefill_threads)
        except ProtocolError as e:
            raise TPGroupError(e.message) from None
        throughput = (c.throughput or figures.tokens_per_s, c.decode_ms or figures.decode_ms_per_block)
        if c.batch.batching:
            decode_batch = (figures.decode_batch_size, figures.decode_batch_tokens_per_s)
    if not (c.batch.batching and decode_batch[1]):  # one step at a time
        decode_batch = (1, 1000 / throughput[1])
    logger.info(
        "throughput %.0f tokens/s per block (prefill), %.2f ms per block (decode), "
        "%.0f tokens/s per block decoding %d sessions at once (tp %d)",
        *throughput,
        decode_batch[1],
        decode_batch[0],
        blocks.tp,
    )
    return throughput, decode_batch


async def degree_speeds(config, group, throughput: tuple[float, float]) -> tuple:
    """`--tp auto` peers announce what they measured at each degree (`tp_speeds`): the full
    group's figures (`throughput`) and, on a one-block stack loaded and freed for it, the
    leader's alone, so the coordinator knows a rank's speed and what the group's all-reduce
    costs. With --throughput and --decode-ms given, the peer announces those figures and no
    tp_speeds. Returns Serving.speeds: ((degree, speed), ...)."""
    c = config
    if not c.tp_choices or (c.throughput is not None and c.decode_ms is not None):
        return ()
    speeds = {c.tp: throughput}
    if 1 in c.tp_choices and c.tp > 1:
        stack = await asyncio.to_thread(group.load_stack, c.start, c.start + 1, 1)
        try:
            speeds[1], _ = await announced_speed(config, stack)
        finally:
            group.drop_stack(stack)
    return tuple(sorted(speeds.items()))
