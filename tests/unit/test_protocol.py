"""The wire protocol: round trips, and that no input makes decoding fail other than cleanly."""

import asyncio
import random
import struct

import msgpack
import pytest
import torch

from hexswarm.swarm.wire.frames import FrameTooLarge, decode, encode, read_frame
from hexswarm.swarm.wire.protocol import (
    PROTOCOL_VERSION,
    Close,
    Error,
    ErrorCode,
    Open,
    Ping,
    ProtocolError,
    Step,
    StepResult,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tensor_round_trip(dtype):
    hidden = torch.randn(2, 3, 8).to(dtype)
    message = decode(encode(Step("s1", 5, hidden)))
    assert isinstance(message, Step) and message.position == 5 and message.session_id == "s1"
    assert message.hidden.dtype == dtype and torch.equal(message.hidden, hidden)


def test_messages_round_trip():
    for message in [
        Open("s", "m-1", 0, 4, 128, 2, "float32"),
        Close("s"),
        Ping(7),
        Error(ErrorCode.BUSY, "full"),
        StepResult("s", torch.zeros(1, 1, 4)),
    ]:
        decoded = decode(encode(message))
        assert type(decoded) is type(message)


def test_a_push_names_the_client_whose_session_it_feeds():
    step = Step("s", 3, torch.zeros(1, 1, 4), ack_ms=100, owner="QmClient")
    assert decode(encode(step)).owner == "QmClient"
    assert decode(encode(Step("s", 0, torch.zeros(1, 1, 4)))).owner == ""
    bad = msgpack.unpackb(encode(step), raw=False) | {"owner": 7}
    with pytest.raises(ProtocolError) as error:
        decode(msgpack.packb(bad, use_bin_type=True))
    assert error.value.code == ErrorCode.MALFORMED


def _frame(**body):
    return msgpack.packb({"v": PROTOCOL_VERSION, **body}, use_bin_type=True)


@pytest.mark.parametrize(
    "payload, code",
    [
        (b"\xc1garbage", ErrorCode.MALFORMED),
        (msgpack.packb([1, 2, 3]), ErrorCode.MALFORMED),
        (msgpack.packb({"v": 99, "t": 1}), ErrorCode.VERSION),
        (_frame(t=42), ErrorCode.MALFORMED),
        (_frame(t=3, session="s", position="0"), ErrorCode.MALFORMED),
        (
            _frame(t=3, session="s", position=0, hidden={"dtype": "int64", "shape": [1], "data": b"\0" * 8}),
            ErrorCode.BAD_TENSOR,
        ),
        (
            _frame(
                t=3, session="s", position=0, hidden={"dtype": "float32", "shape": [2, 2], "data": b"\0" * 4}
            ),
            ErrorCode.BAD_TENSOR,
        ),
        (
            _frame(t=3, session="s", position=0, hidden={"dtype": "float32", "shape": [-1], "data": b""}),
            ErrorCode.BAD_TENSOR,
        ),
        (
            _frame(t=1, session="x" * 100, model="m", start=0, end=1, max_length=1, batch=1, dtype="float32"),
            ErrorCode.MALFORMED,
        ),
    ],
)
def test_bad_frames_raise_typed_errors(payload, code):
    with pytest.raises(ProtocolError) as error:
        decode(payload)
    assert error.value.code == code


def test_random_bytes_never_crash_decoding():
    rng = random.Random(0)
    valid = encode(Step("s", 0, torch.randn(1, 2, 4)))
    for _ in range(2000):
        data = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        payload = bytes(data[: rng.randint(0, len(data))])
        try:
            decode(payload)
        except ProtocolError:
            pass


def test_oversized_frame_is_refused_before_reading_it():
    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", 1 << 31))  # announces 2 GiB, sends nothing more
        with pytest.raises(FrameTooLarge):
            await read_frame(reader, max_bytes=1 << 20)

    asyncio.run(go())
