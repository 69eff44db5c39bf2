"""A peer's budget for frames held at once over all its streams (swarm/wire/protocol.py FrameBudget):
a frame that would go over it is refused BUSY from its length prefix, before it is read, and
the peer goes on serving once the held frames are done."""

from __future__ import annotations

import asyncio

import pytest
import torch

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import PeerCore, PeerLimits
from hexswarm.peer.server import PeerServer
from hexswarm.swarm.wire.frames import FrameBudget
from hexswarm.swarm.wire.protocol import Error, ErrorCode, Open, Opened, ProtocolError, Step, StepResult
from tests.unit.test_push import HIDDEN, Stream, spec  # noqa: F401 (fixture)

MIB = 1 << 20


def test_the_budget_refuses_what_would_go_over_and_frees_what_is_released():
    budget = FrameBudget(10)
    budget.take(6)
    with pytest.raises(ProtocolError) as refused:
        budget.take(5)
    assert refused.value.code == ErrorCode.BUSY
    budget.release(6)
    budget.take(10)


@pytest.mark.asyncio
async def test_a_frame_over_the_peers_budget_is_refused_before_it_is_read(spec):  # noqa: F811
    blocks = BlockStack.load(spec, 0, 2, torch.float32, torch.device("cpu"))
    core = PeerCore(blocks, spec.model_id, PeerLimits(max_sessions=4, max_length=64, max_batch=1))
    server = PeerServer(core, 2 * MIB, max_streams=8, max_buffered_bytes=3 * MIB)
    slow, greedy, honest = Stream(server, "QmSlow"), Stream(server, "QmGreedy"), Stream(server, "QmHonest")
    for stream, sid in ((slow, "a"), (greedy, "b"), (honest, "c")):
        assert isinstance(await stream.ask(Open(sid, spec.model_id, 0, 2, 64, 1, "float32")), Opened)
    slow.reader.feed_data((2 * MIB).to_bytes(4, "big") + b"\0" * 1000)  # 2 MiB announced, trickling
    await asyncio.sleep(0.05)
    assert server.frames.used == 2 * MIB
    greedy.reader.feed_data((2 * MIB).to_bytes(4, "big"))  # would make 4 MiB held: refused at once
    refusal = await greedy.reply()
    assert isinstance(refusal, Error) and refusal.code == ErrorCode.BUSY and "budget" in refusal.message
    result = await honest.ask(Step("c", 0, torch.randn(1, 3, HIDDEN)))  # small frames still fit
    assert isinstance(result, StepResult)
    slow.reader.feed_eof()  # the trickler gives up: its bytes are released
    await asyncio.wait_for(slow.task, 10)
    assert server.frames.used == 0
    server.close()
