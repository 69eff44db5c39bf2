"""Streams without a session cannot hold every slot of a peer, whatever number of identities
opens them: a newcomer takes the slot of the longest-waiting one. Real sockets on 127.0.0.1,
one remote identity per connection, the peer's real server and core."""

import asyncio
import itertools
from types import SimpleNamespace

import pytest
import torch

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import PeerCore, PeerLimits
from hexswarm.peer.server import PeerServer
from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.wire.frames import read_frame, write_frame
from hexswarm.swarm.wire.protocol import Error, ErrorCode, Open, Opened, Ping, Pong

SLOTS = 4


@pytest.fixture
def core(make_model):
    spec = load_model_spec(make_model(arch="llama"))
    blocks = BlockStack.load(spec, 0, 2, torch.float32, torch.device("cpu"))
    return PeerCore(blocks, spec.model_id, PeerLimits(max_sessions=8, max_length=16, cache_tokens=128))


async def serve(core):
    server = PeerServer(core, max_frame_bytes=1 << 20, max_streams=SLOTS)
    identities = (f"identity-{i}" for i in itertools.count())

    async def handle(reader, writer):
        await server.handle_stream(SimpleNamespace(peer_id=next(identities)), reader, writer)

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, listener, listener.sockets[0].getsockname()[1]


async def ask(port_or_stream, message):
    reader, writer = port_or_stream
    await write_frame(writer, message)
    return await asyncio.wait_for(read_frame(reader), 10)


@pytest.mark.asyncio
async def test_a_newcomer_takes_the_slot_of_the_longest_waiting_stream(core):
    server, listener, port = await serve(core)
    try:
        sybils = [await asyncio.open_connection("127.0.0.1", port) for _ in range(SLOTS)]
        for nonce, stream in enumerate(sybils):
            assert isinstance(await ask(stream, Ping(nonce)), Pong)  # every slot is held, no session
        honest = await asyncio.open_connection("127.0.0.1", port)
        opened = await ask(honest, Open("s", core.model_id, 0, 2, 16, 1, "float32"))
        assert isinstance(opened, Opened)
        assert await asyncio.wait_for(sybils[0][0].read(), 10) == b""  # the oldest was closed
        for nonce, stream in enumerate(sybils[1:]):
            assert isinstance(await ask(stream, Ping(nonce)), Pong)  # the others still wait
        honest[1].close()
    finally:
        listener.close()
        server.close()


@pytest.mark.asyncio
async def test_streams_that_own_sessions_keep_their_slots(core):
    server, listener, port = await serve(core)
    try:
        owners = [await asyncio.open_connection("127.0.0.1", port) for _ in range(SLOTS)]
        for i, stream in enumerate(owners):
            assert isinstance(await ask(stream, Open(f"s{i}", core.model_id, 0, 2, 16, 1, "float32")), Opened)
        late = await asyncio.open_connection("127.0.0.1", port)
        refused = await asyncio.wait_for(read_frame(late[0]), 10)
        assert isinstance(refused, Error) and refused.code == ErrorCode.BUSY
        assert isinstance(await ask(owners[0], Ping(1)), Pong)
    finally:
        listener.close()
        server.close()
