"""Push between peers, in process: the frames, who may push into a session, and fallbacks.

Two PeerServers over tiny real BlockStacks; the link between them is a loopback TCP
connection (no hivemind), and the remote peer id a stream reports is set by the test, as
libp2p's authenticated peer id would be.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import msgpack
import pytest
import torch

from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import PeerCore, PeerLimits
from hexswarm.peer.faults import FaultInjector, FaultPlan
from hexswarm.peer.push import PushLinks
from hexswarm.peer.server import PeerServer
from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.wire.frames import decode, encode, write_frame
from hexswarm.swarm.wire.protocol import (
    MAX_CHAIN,
    PROTOCOL_VERSION,
    Close,
    Error,
    ErrorCode,
    NextHop,
    Open,
    Opened,
    ProtocolError,
    PushAck,
    Step,
    StepResult,
)

HIDDEN = 64


# ---------------------------------------------------------------- frames


def test_push_fields_round_trip():
    hidden = torch.randn(1, 2, 8)
    chain = (NextHop("QmB", "s.2"), NextHop("QmC", "s.3"))
    step = decode(encode(Step("s.1", 3, hidden, chain, 750)))
    assert step.chain == chain and step.ack_ms == 750 and torch.equal(step.hidden, hidden)
    assert decode(encode(Step("s.1", 0, hidden))).chain == ()
    assert decode(encode(Open("s", "m", 0, 2, 8, 1, "float32", "QmA"))).upstream == "QmA"
    assert decode(encode(Open("s", "m", 0, 2, 8, 1, "float32"))).upstream == ""
    assert decode(encode(StepResult("s", hidden, "refused"))).push_error == "refused"
    assert decode(encode(PushAck("s"))) == PushAck("s", 0, "")
    assert decode(encode(Step("s.1", 0, hidden, chain, 750, early=True))).early
    assert not decode(encode(Step("s.1", 0, hidden, chain, 750))).early
    assert decode(encode(StepResult("s", hidden, push_pending=True))).push_pending
    assert decode(encode(PushAck("s", ErrorCode.BUSY, "full"))).code == ErrorCode.BUSY


def _step_frame(**extra) -> bytes:
    tensor = {"dtype": "float32", "shape": [1, 1, 2], "data": b"\0" * 8}
    body = {"v": PROTOCOL_VERSION, "t": 3, "session": "s", "position": 0, "hidden": tensor, **extra}
    return msgpack.packb(body, use_bin_type=True)


@pytest.mark.parametrize(
    "extra",
    [
        {"chain": [], "ack_ms": 10},  # an empty chain
        {"chain": [["QmB", "s2"]] * (MAX_CHAIN + 1), "ack_ms": 10},
        {"chain": [["QmB"]], "ack_ms": 10},  # not a pair
        {"chain": [["QmB", 7]], "ack_ms": 10},
        {"chain": [["", "s2"]], "ack_ms": 10},  # no peer id
        {"chain": [["Q" * 129, "s2"]], "ack_ms": 10},
        {"chain": [["QmB", "x" * 65]], "ack_ms": 10},  # a session id too long
        {"chain": [["QmB", "s2"]]},  # a chain needs ack_ms
        {"chain": [["QmB", "s2"]], "ack_ms": 0},
        {"ack_ms": -1},
        {"ack_ms": 10**9},
        {"chain": "QmB"},
    ],
)
def test_bad_push_fields_are_malformed(extra):
    with pytest.raises(ProtocolError) as info:
        decode(_step_frame(**extra))
    assert info.value.code == ErrorCode.MALFORMED


# ---------------------------------------------------------------- servers


@dataclass
class Info:
    peer_id: str  # what libp2p would report: the authenticated remote peer id


class Stream:
    """One in-memory stream into a PeerServer, from a remote with a given peer id."""

    def __init__(self, server: PeerServer, remote: str):
        self.reader, self.replies = asyncio.StreamReader(), asyncio.Queue()
        self.task = asyncio.create_task(server.handle_stream(Info(remote), self.reader, self))

    def write(self, data: bytes) -> None:  # the peer's replies, parsed as they come
        while data:
            size = int.from_bytes(data[:4], "big")
            self.replies.put_nowait(decode(bytes(data[4 : 4 + size])))
            data = data[4 + size :]

    async def drain(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def send(self, message) -> None:
        payload = encode(message)
        self.reader.feed_data(len(payload).to_bytes(4, "big") + payload)

    async def ask(self, message, timeout: float = 30):
        self.send(message)
        return await self.reply(timeout)

    async def reply(self, timeout: float = 30):
        return await asyncio.wait_for(self.replies.get(), timeout)

    async def end(self) -> None:
        self.reader.feed_eof()
        await asyncio.wait_for(self.task, 30)


@pytest.fixture(scope="module")
def spec(make_model):
    return load_model_spec(make_model(arch="llama", layers=2, hidden=HIDDEN))


def _server(spec, plan: FaultPlan | None = None) -> PeerServer:
    blocks = BlockStack.load(spec, 0, 2, torch.float32, torch.device("cpu"))
    core = PeerCore(blocks, spec.model_id, PeerLimits(max_sessions=4, max_length=8, max_batch=1))
    server = PeerServer(core, 1 << 20, max_streams=8)
    if plan is not None:
        server.faults = FaultInjector(core, plan)
    return server


def _open(spec, session: str, upstream: str = "") -> Open:
    return Open(session, spec.model_id, 0, 2, 8, 1, "float32", upstream)


@pytest.mark.asyncio
async def test_only_the_named_upstream_may_push_into_a_session(spec):
    server = _server(spec)
    client = Stream(server, "client")
    assert isinstance(await client.ask(_open(spec, "s", upstream="prev")), Opened)
    hidden = torch.randn(1, 1, HIDDEN)
    for remote, session in [("stranger", "s"), ("client", "s"), ("prev", "unknown")]:
        other = Stream(server, remote)  # the same refusal for a wrong pusher and an unknown session
        assert await other.ask(Step(session, 0, hidden, ack_ms=100, owner="client")) == PushAck(
            session, ErrorCode.UNKNOWN_SESSION, f"no session {session!r} takes pushes from this peer"
        )
        await other.end()
    assert server.core.get("s", "client").position == 0 and client.replies.empty()

    prev = Stream(server, "prev")
    assert await prev.ask(Step("s", 0, hidden, ack_ms=100)) == PushAck(  # whose session "s"?
        "s", ErrorCode.UNKNOWN_SESSION, "no session 's' takes pushes from this peer"
    )
    assert await prev.ask(Step("s", 0, hidden, ack_ms=100, owner="client")) == PushAck("s")
    result = await client.reply()  # the result goes to the session's client, not to the pusher
    assert isinstance(result, StepResult) and result.hidden.shape == hidden.shape
    assert server.core.get("s", "client").position == 1
    bad = await prev.ask(Step("s", 2, hidden, ack_ms=100, owner="client"))  # the usual step checks apply
    assert bad.code == ErrorCode.BAD_STATE and "position" in bad.message
    await prev.end()
    await client.end()
    server.close()


@pytest.mark.asyncio
async def test_a_session_id_taken_by_another_remote_is_not_squatted(spec):
    """A liar that learned a client's session id and opened it first holds its own session:
    the client's OPEN, steps and pushes reach the client's (sessions are scoped by opener)."""
    server = _server(spec)
    squatter, client = Stream(server, "liar"), Stream(server, "client")
    assert isinstance(await squatter.ask(_open(spec, "s", upstream="prev")), Opened)
    assert isinstance(await client.ask(_open(spec, "s", upstream="prev")), Opened)
    hidden = torch.randn(1, 2, HIDDEN)
    assert isinstance(await client.ask(Step("s", 0, hidden)), StepResult)
    assert server.core.get("s", "client").position == 2 and server.core.get("s", "liar").position == 0
    await squatter.ask(Close("s"))  # closes its own, not the client's
    assert server.core.get("s", "client").position == 2
    await squatter.end()
    await client.end()
    server.close()


@pytest.mark.asyncio
async def test_a_session_without_an_upstream_takes_no_pushes(spec):
    server = _server(spec)
    client = Stream(server, "client")
    await client.ask(_open(spec, "s"))
    other = Stream(server, "")  # even a remote whose id is empty, like the unset upstream
    assert (
        await other.ask(Step("s", 0, torch.randn(1, 1, HIDDEN), ack_ms=100, owner="client"))
    ).code == ErrorCode.UNKNOWN_SESSION
    await other.end()
    await client.end()
    server.close()


@contextlib.asynccontextmanager
async def linked(spec, plan: FaultPlan | None = None):
    """Server A pushing to server B over loopback TCP; B sees the link's remote as "A"."""
    a, b = _server(spec), _server(spec, plan)
    tcp = await asyncio.start_server(lambda r, w: b.handle_stream(Info("A"), r, w), "127.0.0.1", 0)
    port = tcp.sockets[0].getsockname()[1]
    a.pusher = PushLinks(lambda peer_id: asyncio.open_connection("127.0.0.1", port))
    try:
        yield a, b
    finally:
        a.pusher.close()
        tcp.close()
        a.close()
        b.close()


async def _chain_step(spec, a, b, hidden):
    """A client opens a hop on A and one on B (upstream A) and sends one step with a chain."""
    to_a, to_b = Stream(a, "client"), Stream(b, "client")
    await to_a.ask(_open(spec, "h1"))
    await to_b.ask(_open(spec, "h2", upstream="A"))
    out_a = await to_a.ask(Step("h1", 0, hidden, (NextHop("B", "h2"),), ack_ms=2000))
    return to_a, to_b, out_a


@pytest.mark.asyncio
async def test_a_peer_pushes_its_output_to_the_next_peer(spec):
    hidden = torch.randn(1, 3, HIDDEN)
    async with linked(spec) as (a, b):
        to_a, to_b, out_a = await _chain_step(spec, a, b, hidden)
        assert isinstance(out_a, StepResult) and out_a.push_error == ""
        out_b = await to_b.reply()
        # The relayed reference: the same blocks, client-fed, on fresh sessions.
        await to_a.ask(_open(spec, "r1"))
        await to_b.ask(_open(spec, "r2"))
        ref_a = await to_a.ask(Step("r1", 0, hidden))
        ref_b = await to_b.ask(Step("r2", 0, ref_a.hidden))
        assert torch.equal(out_a.hidden, ref_a.hidden) and torch.equal(out_b.hidden, ref_b.hidden)
        await to_a.end()
        await to_b.end()


@pytest.mark.parametrize("mode, reason", [("refuse", "refused the push: BUSY"), ("drop", "no PUSH_ACK")])
@pytest.mark.asyncio
async def test_a_failed_push_is_reported_to_the_client_and_leaves_the_next_hop_as_it_was(spec, mode, reason):
    async with linked(spec, FaultPlan(push=mode)) as (a, b):
        to_a, to_b, out_a = await _chain_step(spec, a, b, torch.randn(1, 1, HIDDEN))
        assert isinstance(out_a, StepResult) and reason in out_a.push_error
        assert b.core.get("h2", "client").position == 0 and to_b.replies.empty()
        # The client then relays that hop itself.
        assert isinstance(await to_b.ask(Step("h2", 0, out_a.hidden)), StepResult)
        await to_a.end()
        await to_b.end()


@pytest.mark.parametrize("mode", [None, "refuse", "drop"])
@pytest.mark.asyncio
async def test_an_early_step_is_answered_before_its_push_and_the_outcome_follows(spec, mode):
    """Step.early: A's answer comes first (push_pending), then a PUSH_ACK on the client's stream
    saying whether B took the push; B's answer is the same as when A waited for the ack."""
    hidden = torch.randn(1, 2, HIDDEN)
    async with linked(spec, FaultPlan(push=mode) if mode else None) as (a, b):
        to_a, to_b = Stream(a, "client"), Stream(b, "client")
        await to_a.ask(_open(spec, "h1"))
        await to_b.ask(_open(spec, "h2", upstream="A"))
        out_a = await to_a.ask(Step("h1", 0, hidden, (NextHop("B", "h2"),), ack_ms=500, early=True))
        assert isinstance(out_a, StepResult) and out_a.push_pending and out_a.push_error == ""
        outcome = await to_a.reply()
        assert isinstance(outcome, PushAck) and outcome.session_id == "h1"
        if mode is None:
            assert outcome.code == 0 and isinstance(await to_b.reply(), StepResult)
        else:
            assert outcome.code == ErrorCode.PUSH_FAILED and outcome.message, outcome
            assert b.core.get("h2", "client").position == 0 and to_b.replies.empty()
        next_a = await to_a.ask(Step("h1", 2, hidden[:, :1]))  # the stream goes on as before
        assert isinstance(next_a, StepResult) and not next_a.push_pending
        await to_a.end()
        await to_b.end()


@pytest.mark.asyncio
async def test_an_unreachable_next_peer_is_a_failed_push_not_an_error():
    async def refuse(peer_id):
        raise ConnectionRefusedError(f"no route to {peer_id}")

    links = PushLinks(refuse)
    why = await links.push("QmNobody", Step("s", 0, torch.zeros(1, 1, 2), ack_ms=50), 0.5)
    assert "ConnectionRefusedError" in why


@pytest.mark.asyncio
async def test_a_link_answering_garbage_fails_its_waiting_pushes():
    async def garbage(reader, writer):
        await reader.read(1)
        await write_frame(writer, Error(ErrorCode.MALFORMED, "what"))
        writer.close()

    tcp = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = tcp.sockets[0].getsockname()[1]
    links = PushLinks(lambda peer_id: asyncio.open_connection("127.0.0.1", port))
    why = await links.push("QmB", Step("s", 0, torch.zeros(1, 1, 2), ack_ms=50), 5)
    assert "MALFORMED" in why and not links.links  # the broken link is gone; the next push opens one
    links.close()
    tcp.close()


@pytest.mark.asyncio
async def test_pushed_steps_of_different_sessions_still_batch(spec):
    from hexswarm.peer.scheduler import BatchPolicy

    blocks = BlockStack.load(spec, 0, 2, torch.float32, torch.device("cpu"))
    core = PeerCore(blocks, spec.model_id, PeerLimits(max_sessions=4, max_length=8, max_batch=1))
    # A long window: the batch forms once both sessions' steps wait, however slow the machine.
    server = PeerServer(core, 1 << 20, max_streams=8, policy=BatchPolicy(batch_window_ms=5000))
    assert server.scheduler.can_batch
    clients = [Stream(server, "client") for _ in range(2)]
    for i, client in enumerate(clients):
        await client.ask(_open(spec, f"s{i}", upstream="A"))
    link = Stream(server, "A")  # one link from the previous peer carries both sessions' pushes
    for i in range(2):
        link.send(Step(f"s{i}", 0, torch.randn(1, 1, HIDDEN), ack_ms=1000, owner="client"))
    assert {(await link.reply()).session_id for _ in range(2)} == {"s0", "s1"}
    for client in clients:
        assert isinstance(await client.reply(), StepResult)
    assert server.scheduler.batch_sizes == {2: 1}  # one decode batch of both sessions
    await link.end()
    for client in clients:
        await client.end()
    server.close()
