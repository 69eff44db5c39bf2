"""Fuzzing the frame decoder and the peer's stream handler with hypothesis, in process.

The handler runs on a real PeerCore over a tiny real BlockStack; its stream is an in-memory
asyncio.StreamReader fed with the fuzzed bytes and a writer that keeps what the peer sends.
Every input must end in well-formed reply frames (one per complete frame), every refusal a
typed error (never INTERNAL), within a bounded time.
"""

from __future__ import annotations

import asyncio
import struct

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hexswarm.peer.admission import Admission, AdmissionLimits
from hexswarm.peer.blocks import BlockStack
from hexswarm.peer.core import PeerCore, PeerLimits
from hexswarm.peer.server import PeerServer
from hexswarm.swarm.models.model_spec import load_model_spec
from hexswarm.swarm.wire.frames import FrameTooLarge, decode, encode, read_payload
from hexswarm.swarm.wire.protocol import (
    PROTOCOL_VERSION,
    Close,
    Error,
    ErrorCode,
    Message,
    MsgType,
    NextHop,
    Open,
    Ping,
    ProtocolError,
    Step,
)

HIDDEN = 64
MAX_FRAME = 64 << 10
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------- strategies

msgpack_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=20),
    st.binary(max_size=40),
)
msgpack_values = st.recursive(
    msgpack_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "v",
    "t",
    "session",
    "model",
    "start",
    "end",
    "max_length",
    "batch",
    "dtype",
    "position",
    "hidden",
    "nonce",
    "code",
    "message",
    "chain",  # push between peers (peer/push.py)
    "ack_ms",
    "upstream",
    "push_error",
]
frame_maps = st.dictionaries(st.sampled_from(FIELDS), msgpack_values, max_size=8).map(
    lambda d: {"v": PROTOCOL_VERSION, **d} if d.get("v") is None else d
)
tensor_maps = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["float32", "float16", "bfloat16", "int8", ""]),
        "shape": st.lists(st.integers(0, 70), max_size=4),
        "data": st.binary(max_size=600),
    }
)
session_ids = st.sampled_from(["s", "t", "", "x" * 65])


@st.composite
def valid_tensors(draw):
    batch, tokens = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    hidden = draw(st.sampled_from([HIDDEN, HIDDEN - 1]))
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    tensor = torch.randn(batch, tokens, hidden).to(dtype)
    if draw(st.booleans()):
        tensor[0, 0, 0] = draw(st.sampled_from([float("nan"), float("inf"), 1e30]))
    return tensor


def _open(draw_args):
    session, model, start, end, max_length, batch, dtype = draw_args
    return Open(session, model, start, end, max_length, batch, dtype)


messages = st.one_of(
    st.tuples(
        session_ids,
        st.sampled_from(["MODEL", "other"]),
        st.integers(-2, 4),
        st.integers(-1, 5),
        st.integers(-1, 40),
        st.integers(-1, 3),
        st.sampled_from(["float32", "float16", "int64"]),
    ).map(_open),
    st.builds(Step, session_ids, st.integers(-1, 6), valid_tensors()),
    # a client's step with a chain to push along, and a step pushed by a (stranger) peer
    st.builds(
        Step,
        session_ids,
        st.integers(-1, 6),
        valid_tensors(),
        st.lists(
            st.builds(NextHop, st.sampled_from(["QmNext", "x"]), session_ids), min_size=1, max_size=3
        ).map(tuple),
        st.integers(1, 50),
    ),
    st.builds(Step, session_ids, st.integers(-1, 6), valid_tensors(), st.just(()), st.integers(1, 50)),
    st.builds(Close, session_ids),
    st.builds(Ping, st.integers(0, 2**63)),
)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


frames = st.one_of(
    messages.map(lambda m: ("msg", m)),
    frame_maps.map(lambda d: ("raw", _frame(msgpack.packb(d, use_bin_type=True)))),
    st.builds(
        lambda t: {"v": PROTOCOL_VERSION, "t": int(MsgType.STEP), "session": "s", "position": 0, "hidden": t},
        tensor_maps,
    ).map(lambda d: ("raw", _frame(msgpack.packb(d, use_bin_type=True)))),
    st.binary(max_size=200).map(lambda b: ("raw", _frame(b))),
)


# ---------------------------------------------------------------- the decoder


@FUZZ
@given(st.binary(max_size=500))
def test_decode_of_any_bytes_is_a_message_or_a_typed_error(payload):
    try:
        decode(payload)
    except ProtocolError as e:
        assert isinstance(e.code, ErrorCode)


@FUZZ
@given(frame_maps)
def test_decode_of_any_map_is_a_message_or_a_typed_error(fields):
    try:
        message = decode(msgpack.packb(fields, use_bin_type=True))
    except ProtocolError as e:
        assert isinstance(e.code, ErrorCode)
    else:
        assert decode(encode(message)) is not None  # what is accepted can be sent again


@FUZZ
@given(tensor_maps)
def test_decode_of_any_tensor_is_a_tensor_or_bad_tensor(tensor):
    payload = msgpack.packb(
        {"v": PROTOCOL_VERSION, "t": int(MsgType.STEP), "session": "s", "position": 0, "hidden": tensor}
    )
    try:
        step = decode(payload)
    except ProtocolError as e:
        assert e.code in (ErrorCode.BAD_TENSOR, ErrorCode.MALFORMED)
    else:
        assert list(step.hidden.shape) == tensor["shape"]


@FUZZ
@given(st.binary(max_size=300), st.integers(0, 100))
@pytest.mark.asyncio
async def test_read_payload_reads_a_frame_refuses_a_large_one_or_hits_eof(data, limit):
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    try:
        payload = await asyncio.wait_for(read_payload(reader, limit), 5)
    except FrameTooLarge as e:
        assert e.code == ErrorCode.FRAME_TOO_LARGE
    except asyncio.IncompleteReadError:
        pass
    else:
        assert len(payload) <= limit


# ---------------------------------------------------------------- the handler


class MemoryWriter:
    """The writing half of an in-memory stream: keeps the bytes the peer sends."""

    def __init__(self):
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionError("closed")
        self.data += data

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def core(make_model):
    spec = load_model_spec(make_model(arch="llama", layers=2, hidden=HIDDEN))
    blocks = BlockStack.load(spec, 0, 2, torch.float32, torch.device("cpu"))
    limits = PeerLimits(max_sessions=2, max_length=8, max_batch=2, cache_tokens=24)
    return PeerCore(blocks, spec.model_id, limits)


def _replies(data: bytes) -> list[Message]:
    replies, offset = [], 0
    while offset < len(data):
        (size,) = struct.unpack_from(">I", data, offset)
        replies.append(decode(bytes(data[offset + 4 : offset + 4 + size])))
        offset += 4 + size
    return replies


@FUZZ
@given(st.lists(frames, max_size=8), st.binary(max_size=3))
@pytest.mark.asyncio
async def test_handler_answers_every_frame_with_a_reply_or_a_typed_error(core, stream, tail):
    server = PeerServer(core, MAX_FRAME, max_streams=4, admission=Admission(AdmissionLimits()))
    reader, writer = asyncio.StreamReader(), MemoryWriter()
    for kind, item in stream:
        if kind == "msg" and isinstance(item, Open):
            item = Open(
                item.session_id, core.model_id if item.model_id == "MODEL" else item.model_id, *_rest(item)
            )
        reader.feed_data(_frame(encode(item)) if kind == "msg" else item)
    reader.feed_data(tail)  # a truncated length prefix
    reader.feed_eof()
    await asyncio.wait_for(server.handle_stream(None, reader, writer), 30)
    replies = _replies(writer.data)
    assert len(replies) == len(stream)  # one reply per complete frame (all are under MAX_FRAME)
    codes = [r.code for r in replies if isinstance(r, Error)]
    assert all(isinstance(c, ErrorCode) and c != ErrorCode.INTERNAL for c in codes), replies
    assert not core.sessions  # the stream ended: its sessions are freed
    assert writer.closed and server.open_streams == 0


def _rest(o: Open) -> tuple:
    return o.start, o.end, o.max_length, o.batch_size, o.dtype


@pytest.mark.asyncio
async def test_handler_ends_a_stream_at_an_oversized_frame(core):
    server = PeerServer(core, MAX_FRAME, max_streams=4)
    reader, writer = asyncio.StreamReader(), MemoryWriter()
    reader.feed_data(_frame(encode(Ping(1))) + struct.pack(">I", MAX_FRAME + 1) + b"\0" * 10)
    reader.feed_data(_frame(encode(Ping(2))))  # never read: the stream cannot be resynchronized
    reader.feed_eof()
    await asyncio.wait_for(server.handle_stream(None, reader, writer), 10)
    replies = _replies(writer.data)
    assert [type(r).__name__ for r in replies] == ["Pong", "Error"]
    assert replies[1].code == ErrorCode.FRAME_TOO_LARGE
