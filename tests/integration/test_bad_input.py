"""Bad input to a live peer gets a typed error frame, and the peer keeps serving everyone."""

import asyncio
import random
import struct
import time

import msgpack
import pytest
import torch
from hivemind.p2p import PeerID

from hexswarm.client.remote import PeerConnection, PeerError
from hexswarm.client.worker import run_sync
from hexswarm.swarm.trust.records import read_peer_records
from hexswarm.swarm.wire.frames import encode, read_frame
from hexswarm.swarm.wire.protocol import (
    PROTOCOL_VERSION,
    SESSION_PROTOCOL,
    Close,
    Closed,
    Error,
    ErrorCode,
    Open,
    Opened,
    Ping,
    Pong,
    Step,
    StepResult,
)
from tests.integration.conftest import peer_id_of

pytestmark = pytest.mark.integration
HIDDEN = 128  # the test model's hidden size


class RawStream:
    """A hand-driven stream to a peer: send any bytes, read one frame back."""

    def __init__(self, model, peer_id: str):
        self.model = model
        _, self.reader, self.writer = run_sync(
            model.swarm.p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), SESSION_PROTOCOL),
            timeout=30,
        )

    def send_bytes(self, data: bytes) -> None:
        async def go():
            self.writer.write(data)
            await self.writer.drain()

        run_sync(go(), timeout=30)

    def send(self, message) -> None:
        payload = encode(message)
        self.send_bytes(struct.pack(">I", len(payload)) + payload)

    def recv(self):
        return run_sync(read_frame(self.reader), timeout=30)

    def ask(self, message):
        self.send(message)
        return self.recv()

    def close(self) -> None:
        async def go():  # transports are not thread-safe: close on the client's loop
            self.writer.close()

        run_sync(go(), timeout=10)


@pytest.fixture
def guard(model):
    stream = RawStream(model, peer_id_of(model, "guard"))
    yield stream
    stream.close()


def _open(model, session="s", start=0, end=3, max_length=16, batch=1, dtype="float32"):
    return Open(session, model.spec.model_id, start, end, max_length, batch, dtype)


def _error_code(reply):
    assert isinstance(reply, Error), reply
    return reply.code


def _still_serves(stream, model, session="ok"):
    assert isinstance(stream.ask(_open(model, session)), Opened)
    reply = stream.ask(Step(session, 0, torch.randn(1, 2, HIDDEN)))
    assert isinstance(reply, StepResult) and reply.hidden.shape == (1, 2, HIDDEN)
    assert isinstance(stream.ask(Close(session)), Closed)


def test_malformed_frames(guard, model):
    for payload in [
        b"\xc1\xc1\xc1",
        msgpack.packb([1, 2]),
        msgpack.packb({"v": PROTOCOL_VERSION, "t": 77}),
        msgpack.packb({"v": PROTOCOL_VERSION, "t": 3, "session": 5}),
    ]:
        guard.send_bytes(struct.pack(">I", len(payload)) + payload)
        assert _error_code(guard.recv()) == ErrorCode.MALFORMED
    assert _error_code(guard.ask(Pong(1))) == ErrorCode.BAD_STATE  # a reply-only message
    assert isinstance(guard.ask(Ping(5)), Pong)
    _still_serves(guard, model)


def test_protocol_version_mismatch(guard):
    payload = msgpack.packb({"v": PROTOCOL_VERSION + 1, "t": 7, "nonce": 1})
    guard.send_bytes(struct.pack(">I", len(payload)) + payload)
    assert _error_code(guard.recv()) == ErrorCode.VERSION


def test_oversized_frame_ends_only_that_stream(guard, model):
    guard.send_bytes(struct.pack(">I", 2 << 20) + b"\0" * 1024)  # guard accepts at most 1 MiB
    assert _error_code(guard.recv()) == ErrorCode.FRAME_TOO_LARGE
    with pytest.raises(asyncio.IncompleteReadError):
        guard.recv()
    _still_serves(RawStream(model, peer_id_of(model, "guard")), model)


def test_wrong_dtype_and_shape(guard, model):
    assert isinstance(guard.ask(_open(model)), Opened)
    assert _error_code(guard.ask(Step("s", 0, torch.randn(1, 2, HIDDEN).half()))) == ErrorCode.BAD_TENSOR
    assert _error_code(guard.ask(Step("s", 0, torch.randn(1, 2, HIDDEN + 1)))) == ErrorCode.BAD_TENSOR
    assert _error_code(guard.ask(Step("s", 0, torch.randn(2, 2, HIDDEN)))) == ErrorCode.BAD_TENSOR
    assert _error_code(guard.ask(Step("s", 0, torch.randn(2, HIDDEN)))) == ErrorCode.BAD_TENSOR
    assert _error_code(guard.ask(_open(model, "t", dtype="int64"))) == ErrorCode.BAD_TENSOR
    assert isinstance(guard.ask(Step("s", 0, torch.randn(1, 2, HIDDEN))), StepResult)  # session intact


def test_layers_not_served_and_wrong_model(guard, model):
    assert _error_code(guard.ask(_open(model, start=2, end=5))) == ErrorCode.WRONG_LAYERS
    wrong = Open("s", "some-other-model", 0, 3, 16, 1, "float32")
    assert _error_code(guard.ask(wrong)) == ErrorCode.WRONG_MODEL


def test_unknown_session_and_other_streams_sessions(guard, model):
    assert (
        _error_code(guard.ask(Step("never-opened", 0, torch.randn(1, 1, HIDDEN))))
        == ErrorCode.UNKNOWN_SESSION
    )
    assert _error_code(guard.ask(Close("never-opened"))) == ErrorCode.UNKNOWN_SESSION
    assert isinstance(guard.ask(_open(model, "mine")), Opened)
    intruder = RawStream(model, peer_id_of(model, "guard"))
    try:  # a session is bound to the stream that opened it
        assert (
            _error_code(intruder.ask(Step("mine", 0, torch.randn(1, 1, HIDDEN)))) == ErrorCode.UNKNOWN_SESSION
        )
    finally:
        intruder.close()


def test_over_long_sequences(guard, model):
    assert _error_code(guard.ask(_open(model, max_length=33))) == ErrorCode.TOO_LONG  # guard: --max-length 32
    assert isinstance(guard.ask(_open(model, max_length=4)), Opened)
    assert _error_code(guard.ask(Step("s", 0, torch.randn(1, 5, HIDDEN)))) == ErrorCode.TOO_LONG
    assert isinstance(guard.ask(Step("s", 0, torch.randn(1, 4, HIDDEN))), StepResult)
    assert _error_code(guard.ask(Step("s", 4, torch.randn(1, 1, HIDDEN)))) == ErrorCode.TOO_LONG


def test_session_limit(guard, model):
    assert isinstance(guard.ask(_open(model, "a")), Opened)
    assert isinstance(guard.ask(_open(model, "b")), Opened)
    assert _error_code(guard.ask(_open(model, "c"))) == ErrorCode.BUSY  # guard: --max-sessions 2
    assert isinstance(guard.ask(Close("a")), Closed)
    assert isinstance(guard.ask(_open(model, "c")), Opened)


def test_client_error_names_the_peer_and_the_reason(model):
    async def go():
        conn = await PeerConnection.connect(
            model.swarm.p2p, PeerID.from_base58(peer_id_of(model, "guard")), "guard"
        )
        try:
            await conn.open("x", model.spec.model_id, 0, 3, 1000, 1, torch.float32)
        finally:
            conn.close()

    with pytest.raises(PeerError, match=r"peer guard refused: TOO_LONG: max_length 1000") as error:
        run_sync(go(), timeout=30)
    assert error.value.peer == "guard" and error.value.code == ErrorCode.TOO_LONG


def test_flood_of_garbage_streams(model, local_model):
    """Bounded: 40 streams x 5 junk frames at once, then the peer serves a real generation."""
    guard_id = PeerID.from_base58(peer_id_of(model, "guard"))
    rng = random.Random(0)
    junk = [bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))) for _ in range(200)]

    async def one(i):
        try:
            _, reader, writer = await model.swarm.p2p.call_binary_stream_handler(guard_id, SESSION_PROTOCOL)
        except Exception:
            return
        try:
            for payload in junk[5 * i : 5 * i + 5]:
                writer.write(struct.pack(">I", len(payload)) + payload)
            await writer.drain()
            for _ in range(5):
                await asyncio.wait_for(read_frame(reader), 20)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()

    async def flood():
        await asyncio.gather(*(one(i) for i in range(40)))

    run_sync(flood(), timeout=120)
    stream = RawStream(model, peer_id_of(model, "guard"))
    try:
        _still_serves(stream, model, session="after-flood")
    finally:
        stream.close()
    input_ids = torch.tensor([[11, 22, 33, 44]])
    expected = local_model.generate(input_ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(model.generate(input_ids, max_new_tokens=8, do_sample=False), expected)


def test_abandoned_session_is_freed_on_disconnect(model):
    from hexswarm.swarm.trust.records import read_peer_records

    def guard_record():
        return next(r for r in read_peer_records(model.swarm.dht, model.spec.model_id) if r.name == "guard")

    def wait_until(predicate, timeout=20):
        deadline = time.monotonic() + timeout
        while not predicate(guard_record()):
            assert time.monotonic() < deadline, guard_record()
            time.sleep(0.3)

    wait_until(lambda r: r.open_sessions == 0)
    full = guard_record().cache_tokens_left
    stream = RawStream(model, peer_id_of(model, "guard"))
    assert isinstance(stream.ask(_open(model, "abandoned")), Opened)
    wait_until(lambda r: r.open_sessions == 1 and r.cache_tokens_left < full)
    stream.close()  # gone without a CLOSE frame
    wait_until(lambda r: r.open_sessions == 0 and r.cache_tokens_left == full)


def test_one_session_or_one_remote_cannot_take_the_whole_cache(model):
    """p1 runs with the defaults: 16 sessions x 2,048 tokens = 32,768 cache tokens, of which one
    session may reserve a quarter and one remote's sessions half."""
    stream = RawStream(model, peer_id_of(model, "p1"))
    try:
        hoard = _open(model, "hoard", max_length=2048, batch=16)
        reply = stream.ask(hoard)
        assert _error_code(reply) == ErrorCode.BUSY and "one session may reserve 8192" in reply.message
        for session in ("a", "b"):
            assert isinstance(stream.ask(_open(model, session, max_length=2048, batch=4)), Opened)
        reply = stream.ask(_open(model, "c"))
        assert _error_code(reply) == ErrorCode.REMOTE_LIMIT and "16384 cache tokens" in reply.message
        assert isinstance(stream.ask(Close("a")), Closed)
        _still_serves(stream, model)
        record = next(r for r in read_peer_records(model.swarm.dht, model.spec.model_id) if r.name == "p1")
        assert record.cache_tokens_left <= 8192  # routers are told what one new session can reserve
    finally:
        stream.close()


def test_pings_alone_cannot_hold_a_stream_slot(model):
    """guard: --handshake-timeout 8. The window counts from the stream's start, not per frame."""
    stream = RawStream(model, peer_id_of(model, "guard"))
    began = time.monotonic()
    try:
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            for nonce in range(60):
                assert isinstance(stream.ask(Ping(nonce)), Pong)
                time.sleep(0.5)
        assert 7 < time.monotonic() - began < 20
    finally:
        stream.close()


def test_frames_before_a_session_opens_are_small(model):
    hidden = torch.randn(1, 200, HIDDEN)  # 100 KiB of hidden states: over the 64 KiB before a session
    payload = encode(Step("s", 0, hidden))
    stream = RawStream(model, peer_id_of(model, "p1"))
    try:  # the length prefix alone is refused (sending the rest would race the peer's close)
        stream.send_bytes(struct.pack(">I", len(payload)) + payload[:1024])
        assert _error_code(stream.recv()) == ErrorCode.FRAME_TOO_LARGE
    finally:
        stream.close()
    stream = RawStream(model, peer_id_of(model, "p1"))
    try:  # the same frame on a stream that owns a session is an ordinary prefill
        assert isinstance(stream.ask(_open(model, "big", max_length=256)), Opened)
        assert isinstance(stream.ask(Step("big", 0, hidden)), StepResult)
        assert isinstance(stream.ask(Close("big")), Closed)
    finally:
        stream.close()
