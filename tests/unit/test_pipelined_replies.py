"""A client's reads that overlap on a real stream (client/remote.py, client/hop_links.py): an
OPEN sent without waiting, answered before the first step's result; a pushing peer's early
answer, whose push outcome the client reads while it waits for the next hop.

PeerServers over tiny real BlockStacks, reached over loopback TCP (no hivemind), as in
test_push.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from hexswarm.client.hop_links import HopLinks
from hexswarm.client.remote import PeerConnection, PeerError
from hexswarm.peer.faults import FaultPlan
from hexswarm.swarm.wire.protocol import ErrorCode, NextHop, Step
from tests.unit.test_push import HIDDEN, Info, _server, linked, spec  # noqa: F401 (spec: a fixture)


async def _connect(server, remote: str = "client") -> tuple[asyncio.Server, PeerConnection]:
    tcp = await asyncio.start_server(lambda r, w: server.handle_stream(Info(remote), r, w), "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", tcp.sockets[0].getsockname()[1])
    return tcp, PeerConnection("peer", "peer", reader, writer, timeout=30)


@pytest.mark.asyncio
async def test_a_pipelined_open_is_answered_first_and_a_refused_one_fails_the_step(spec):  # noqa: F811
    server = _server(spec)
    hidden = torch.randn(1, 3, HIDDEN)
    tcp, conn = await _connect(server)
    await conn.open("s", spec.model_id, 0, 2, 8, 1, torch.float32, wait=False)
    out = await conn.step("s", 0, hidden)  # the STEP went out right behind the OPEN
    assert out.shape == hidden.shape and conn.opening is None and conn.logs["s"].position == 3
    conn.close()
    tcp.close()

    tcp, conn = await _connect(server)  # one session per stream
    await conn.open("t", spec.model_id, 0, 3, 8, 1, torch.float32, wait=False)  # blocks it lacks
    with pytest.raises(PeerError) as refused:
        await conn.step("t", 0, hidden)
    assert refused.value.code == ErrorCode.WRONG_LAYERS, refused.value
    conn.close()
    tcp.close()
    server.close()


@pytest.mark.parametrize("mode", [None, "refuse", "drop"])
@pytest.mark.asyncio
async def test_the_client_reads_an_early_answers_push_outcome_beside_the_next_hop(spec, mode):  # noqa: F811
    """The next hop's answer (or the outcome's "taken") ends the wait; a failed push is told as
    soon as its outcome comes, the client relays that hop, and both streams go on in order."""
    hidden = torch.randn(1, 2, HIDDEN)
    async with linked(spec, FaultPlan(push=mode) if mode else None) as (a, b):
        tcp_a, to_a = await _connect(a)
        tcp_b, to_b = await _connect(b)
        await to_a.open("h1", spec.model_id, 0, 2, 8, 1, torch.float32)
        await to_b.open("h2", spec.model_id, 0, 2, 8, 1, torch.float32, upstream="A")
        await to_a.send(Step("h1", 0, hidden, (NextHop("B", "h2"),), ack_ms=500, early=True))
        first = await to_a.step_result("h1", hidden)
        assert first.push_pending
        to_a.expect_outcome("h1", 30)
        pusher, receiver = SimpleNamespace(conn=to_a), SimpleNamespace(conn=to_b)
        why = await HopLinks.push_failure(pusher, receiver)
        if mode is None:
            assert why == ""
            second = (await to_b.step_result("h2", first.hidden)).hidden
        else:
            assert why, "a failed push must be told"
            second = await to_b.step("h2", 0, first.hidden)  # relayed by the client
        assert second.shape == hidden.shape
        assert (await to_a.step("h1", 2, hidden[:, :1])).shape == (1, 1, HIDDEN)  # the outcome was read first
        for conn, tcp in ((to_a, tcp_a), (to_b, tcp_b)):
            conn.close()
            tcp.close()
