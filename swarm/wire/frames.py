"""Messages as bytes and on streams: the frame format of every stream of ours.

Each frame is `u32 big-endian payload length | msgpack map` (swarm/wire/protocol.py has the
messages). `encode` and `decode` turn a message into a payload and back; `decode_*` functions
validate everything and raise `ProtocolError` with an `ErrorCode`, which the receiving side
turns into an `Error` frame for the sender, so a peer never crashes on input. The stream
helpers read a frame only after its length passed the size checks (`read_payload`,
`FrameBudget`).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack

from hexswarm.swarm.wire.checks import ErrorCode, ProtocolError, field, optional_field, require_map
from hexswarm.swarm.wire.commitments import DIGEST_BYTES, MAX_SIGNATURE_BYTES
from hexswarm.swarm.wire.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    MAX_ACK_MS,
    MAX_CHAIN,
    MAX_FORMAT_CHARS,
    PROTOCOL_VERSION,
    Attest,
    Attested,
    Close,
    Closed,
    Error,
    KvPush,
    KvTarget,
    Message,
    MsgType,
    NextHop,
    Open,
    Opened,
    Ping,
    Pong,
    PushAck,
    Step,
    StepResult,
)
from hexswarm.swarm.wire.tensors import decode_tensor, encode_tensor

_LENGTH = struct.Struct(">I")


def encode(message: Message) -> bytes:
    """The payload of one frame (without the length prefix)."""
    body: dict[str, Any] = {"v": PROTOCOL_VERSION}
    match message:
        case Open():
            body.update(
                t=MsgType.OPEN,
                session=message.session_id,
                model=message.model_id,
                start=message.start,
                end=message.end,
                max_length=message.max_length,
                batch=message.batch_size,
                dtype=message.dtype,
            )
            if message.upstream:
                body["upstream"] = message.upstream
            if message.kv_from:
                body["kv_from"] = list(message.kv_from)
            if message.kv_to:
                body["kv_to"] = [[k.peer_id, k.session_id, k.start, k.end] for k in message.kv_to]
            if message.prompt_length:
                body["prompt_length"] = message.prompt_length
        case Opened() | Closed() | Close() | Attest():
            kinds = {
                Opened: MsgType.OPENED,
                Closed: MsgType.CLOSED,
                Close: MsgType.CLOSE,
                Attest: MsgType.ATTEST,
            }
            body.update(t=kinds[type(message)], session=message.session_id)
            if isinstance(message, Opened) and message.owner_marker:
                body.update(owner=message.owner_marker, format=message.format)
        case Attested():
            body.update(
                t=MsgType.ATTESTED,
                session=message.session_id,
                position=message.position,
                signature=message.signature,
            )
        case Step():
            body.update(
                t=MsgType.STEP,
                session=message.session_id,
                position=message.position,
                hidden=encode_tensor(message.hidden),
            )
            if message.chain:
                body["chain"] = [[h.peer_id, h.session_id] for h in message.chain]
            if message.ack_ms:
                body["ack_ms"] = message.ack_ms
            if message.owner:
                body["owner"] = message.owner
            if message.early:
                body["early"] = True
        case StepResult():
            body.update(
                t=MsgType.STEP_RESULT, session=message.session_id, hidden=encode_tensor(message.hidden)
            )
            if message.push_error:
                body["push_error"] = message.push_error
            if message.kv_error:
                body["kv_error"] = message.kv_error
            if message.digest:
                body["digest"] = message.digest
            if message.signature:
                body["signature"] = message.signature
            if message.push_pending:
                body["pending"] = True
        case KvPush():
            body.update(
                t=MsgType.KV_PUSH,
                session=message.session_id,
                layer=message.layer,
                keys=encode_tensor(message.keys),
                values=encode_tensor(message.values),
            )
            if message.owner:
                body["owner"] = message.owner
        case PushAck():
            body.update(
                t=MsgType.PUSH_ACK,
                session=message.session_id,
                code=int(message.code),
                message=message.message,
            )
        case Ping() | Pong():
            body.update(t=MsgType.PING if isinstance(message, Ping) else MsgType.PONG, nonce=message.nonce)
        case Error():
            body.update(t=MsgType.ERROR, code=int(message.code), message=message.message)
        case _:
            raise TypeError(f"not a protocol message: {message!r}")
    return msgpack.packb(body, use_bin_type=True)


def decode(payload: bytes) -> Message:
    """Parses and validates one frame's payload; raises ProtocolError on anything off."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=True, max_bin_len=len(payload))
    except Exception as e:  # msgpack raises many types on garbage
        raise ProtocolError(ErrorCode.MALFORMED, f"frame is not msgpack: {type(e).__name__}") from None
    fields = require_map(obj, "frame")
    version = field(fields, "v", int)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.VERSION, f"protocol version {version} (this side speaks {PROTOCOL_VERSION})"
        )
    kind = field(fields, "t", int)
    if kind not in MsgType._value2member_map_:
        raise ProtocolError(ErrorCode.MALFORMED, f"unknown message type {kind}")
    return _DECODERS[MsgType(kind)](fields)


def _decode_open(f: dict) -> Open:
    return Open(
        session_id=_session(f),
        model_id=field(f, "model", str),
        start=field(f, "start", int),
        end=field(f, "end", int),
        max_length=field(f, "max_length", int),
        batch_size=field(f, "batch", int),
        dtype=field(f, "dtype", str),
        upstream=optional_field(f, "upstream", str, "")[:_MAX_PEER_ID],
        kv_from=tuple(_peer_id(p) for p in _bounded_list(f, "kv_from")),
        kv_to=tuple(_kv_target(item) for item in _bounded_list(f, "kv_to")),
        prompt_length=optional_field(f, "prompt_length", int, 0),
    )


_MAX_PEER_ID = 128  # characters of a base58 peer id, with room to spare
MAX_KV_PEERS = 64  # prefill peers of one decode session, or decode targets of one prefill session


def _bounded_list(f: dict, name: str) -> list:
    items = optional_field(f, name, list, [])
    if len(items) > MAX_KV_PEERS:
        raise ProtocolError(
            ErrorCode.MALFORMED, f"{name} has at most {MAX_KV_PEERS} entries, got {len(items)}"
        )
    return items


def _peer_id(item: Any) -> str:
    if not isinstance(item, str) or not 0 < len(item) <= _MAX_PEER_ID:
        raise ProtocolError(ErrorCode.MALFORMED, f"a peer id must be text of 1..{_MAX_PEER_ID} characters")
    return item


def _kv_target(item: Any) -> KvTarget:
    if not (isinstance(item, list) and len(item) == 4):
        raise ProtocolError(ErrorCode.MALFORMED, "a kv_to entry must be [peer id, session id, start, end]")
    peer_id, session_id, start, end = item
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end)) or not 0 <= start < end:
        raise ProtocolError(
            ErrorCode.MALFORMED, "a kv_to entry's layers must be integers with 0 <= start < end"
        )
    return KvTarget(_peer_id(peer_id), _session({"session": session_id}), start, end)


def _decode_kv_push(f: dict) -> KvPush:
    layer = field(f, "layer", int)
    if layer < 0:
        raise ProtocolError(ErrorCode.MALFORMED, f"layer must be >= 0, got {layer}")
    keys, values = decode_tensor(f.get("keys")), decode_tensor(f.get("values"))
    return KvPush(_session(f), layer, keys, values, _owner(f))


def _decode_step(f: dict) -> Step:
    chain = ()
    if "chain" in f:
        items = field(f, "chain", list)
        if not 0 < len(items) <= MAX_CHAIN:
            raise ProtocolError(ErrorCode.MALFORMED, f"a chain has 1..{MAX_CHAIN} hops, got {len(items)}")
        chain = tuple(_next_hop(item) for item in items)
    ack_ms = optional_field(f, "ack_ms", int, 0)
    if not 0 <= ack_ms <= MAX_ACK_MS or (chain and not ack_ms):
        raise ProtocolError(ErrorCode.MALFORMED, f"ack_ms must be in 1..{MAX_ACK_MS} with a chain or a push")
    hidden = decode_tensor(f.get("hidden"))
    early = optional_field(f, "early", bool, False)
    return Step(_session(f), field(f, "position", int), hidden, chain, ack_ms, _owner(f), early)


def _owner(f: dict) -> str:
    owner = optional_field(f, "owner", str, "")
    return _peer_id(owner) if owner else ""


def _next_hop(item: Any) -> NextHop:
    if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)):
        raise ProtocolError(ErrorCode.MALFORMED, "a chain hop must be [peer id, session id]")
    peer_id, session_id = item
    if not 0 < len(peer_id) <= _MAX_PEER_ID:
        raise ProtocolError(ErrorCode.MALFORMED, f"peer id must be 1..{_MAX_PEER_ID} characters")
    return NextHop(peer_id, _session({"session": session_id}))


def _decode_step_result(f: dict) -> StepResult:
    error = optional_field(f, "push_error", str, "")[:2000]
    kv_error = optional_field(f, "kv_error", str, "")[:2000]
    digest = optional_field(f, "digest", bytes, b"")
    signature = _signature(optional_field(f, "signature", bytes, b""))
    if digest and len(digest) != DIGEST_BYTES:
        raise ProtocolError(
            ErrorCode.MALFORMED, f"a step's digest has {DIGEST_BYTES} bytes, got {len(digest)}"
        )
    pending = optional_field(f, "pending", bool, False)
    hidden = decode_tensor(f.get("hidden"))
    return StepResult(_session(f), hidden, error, kv_error, digest, signature, pending)


def _signature(signature: bytes) -> bytes:
    if len(signature) > MAX_SIGNATURE_BYTES:
        raise ProtocolError(ErrorCode.MALFORMED, f"a signature has at most {MAX_SIGNATURE_BYTES} bytes")
    return signature


def _decode_opened(f: dict) -> Opened:
    marker = optional_field(f, "owner", bytes, b"")
    if len(marker) > MAX_SIGNATURE_BYTES:
        raise ProtocolError(ErrorCode.MALFORMED, f"a public key has at most {MAX_SIGNATURE_BYTES} bytes")
    fmt = optional_field(f, "format", str, "")
    if len(fmt) > MAX_FORMAT_CHARS:  # which formats exist is the client's to check (client/remote.py)
        raise ProtocolError(
            ErrorCode.MALFORMED, f"a compute format has at most {MAX_FORMAT_CHARS} characters"
        )
    return Opened(_session(f), marker, fmt)


def _decode_attested(f: dict) -> Attested:
    position = field(f, "position", int)
    if position < 0:
        raise ProtocolError(ErrorCode.MALFORMED, "a position is never negative")
    return Attested(_session(f), position, _signature(field(f, "signature", bytes)))


def _decode_push_ack(f: dict) -> PushAck:
    code = field(f, "code", int)
    if code != 0 and code not in ErrorCode._value2member_map_:
        code = int(ErrorCode.INTERNAL)
    return PushAck(_session(f), code, field(f, "message", str)[:2000])


def _decode_error(f: dict) -> Error:
    code = field(f, "code", int)
    code = ErrorCode(code) if code in ErrorCode._value2member_map_ else ErrorCode.INTERNAL
    return Error(code=code, message=field(f, "message", str)[:2000])


_DECODERS = {
    MsgType.OPEN: _decode_open,
    MsgType.OPENED: _decode_opened,
    MsgType.STEP: _decode_step,
    MsgType.STEP_RESULT: _decode_step_result,
    MsgType.CLOSE: lambda f: Close(_session(f)),
    MsgType.CLOSED: lambda f: Closed(_session(f)),
    MsgType.PING: lambda f: Ping(field(f, "nonce", int)),
    MsgType.PONG: lambda f: Pong(field(f, "nonce", int)),
    MsgType.ERROR: _decode_error,
    MsgType.PUSH_ACK: _decode_push_ack,
    MsgType.KV_PUSH: _decode_kv_push,
    MsgType.ATTEST: lambda f: Attest(_session(f)),
    MsgType.ATTESTED: _decode_attested,
}


def _session(fields: dict) -> str:
    session_id = field(fields, "session", str)
    if not 0 < len(session_id) <= 64:
        raise ProtocolError(ErrorCode.MALFORMED, "session id must be 1..64 characters")
    return session_id


# ---------------------------------------------------------------- stream I/O


def framed(payload: bytes) -> bytes:
    """`payload` with the length prefix every stream of ours reads (read_payload)."""
    return _LENGTH.pack(len(payload)) + payload


async def write_frame(writer: asyncio.StreamWriter, message: Message) -> None:
    writer.write(framed(encode(message)))
    await writer.drain()


class FrameTooLarge(ProtocolError):
    def __init__(self, size: int, limit: int):
        super().__init__(ErrorCode.FRAME_TOO_LARGE, f"frame of {size} bytes is over the limit of {limit}")


class FrameBudget:
    """Bytes of frames a node may hold at once over all its streams: a frame is counted from
    before it is read until its reader releases it, and one that would go over is refused
    (BUSY) from its length prefix, before any of it is read."""

    def __init__(self, limit_bytes: int):
        self.limit, self.used = limit_bytes, 0

    def take(self, size: int) -> None:
        if self.used + size > self.limit:
            raise ProtocolError(
                ErrorCode.BUSY,
                f"the peer is holding {self.used >> 20} MiB of frames (its budget is {self.limit >> 20} MiB); "
                f"a frame of {size >> 20} MiB must wait",
            )
        self.used += size

    def release(self, size: int) -> None:
        self.used -= size


async def read_payload(
    reader: asyncio.StreamReader, max_bytes: int, budget: FrameBudget | None = None
) -> bytes:
    """Reads one frame's payload. The size checks (against `max_bytes` and what is left of
    `budget`, which the caller then releases by len(payload)) happen before the payload is
    read, so an announced huge frame costs no memory. Raises asyncio.IncompleteReadError on EOF."""
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if size > max_bytes:
        raise FrameTooLarge(size, max_bytes)
    if budget is None:
        return await reader.readexactly(size)
    budget.take(size)
    try:
        return await reader.readexactly(size)
    except BaseException:
        budget.release(size)
        raise


async def read_frame(reader: asyncio.StreamReader, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Message:
    return decode(await read_payload(reader, max_bytes))
