"""Typed errors and field checks for everything decoded from the network.

A `ProtocolError` carries an `ErrorCode`; the receiving side turns it into an ERROR frame for
the sender, so bad input never crashes a peer. The field checks are the only way the decoders
(`swarm/wire/protocol.py`, `swarm/wire/tensors.py`) read a remote map.
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.IntEnum):
    MALFORMED = 1  # not msgpack, missing or mistyped fields
    FRAME_TOO_LARGE = 2
    VERSION = 3  # protocol version we do not speak
    BAD_TENSOR = 4  # wrong dtype, shape or byte count
    WRONG_MODEL = 5
    WRONG_LAYERS = 6  # layers this peer does not serve
    UNKNOWN_SESSION = 7
    TOO_LONG = 8  # beyond the session's (or the peer's) max length
    BUSY = 9  # session limit or cache budget reached
    LEAVING = 10  # the peer is shutting down
    BAD_STATE = 11  # e.g. STEP before OPEN, second OPEN on one stream
    INTERNAL = 12
    PEER_FAILED = 13  # part of the peer (a tensor-parallel rank) died or hung; the peer is leaving
    PUSH_FAILED = 14  # in a PUSH_ACK to a client: the push of its step to the next hop failed
    # 20+: admission limits per remote (peer/admission.py)
    RATE_LIMITED = 20  # over the steps per second of a session; retry a little later
    REMOTE_LIMIT = 21  # this remote already holds its share of the peer's streams or sessions
    BANNED = 22  # this peer re-checked evidence that the remote signed a wrong output


class ProtocolError(Exception):
    """Bad input from the other side; becomes an ERROR frame."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def require_map(obj: Any, what: str) -> dict:
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.MALFORMED, f"{what} must be a map, got {type(obj).__name__}")
    return obj


def field(fields: dict, name: str, kind: type) -> Any:
    value = fields.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(
            ErrorCode.MALFORMED, f"field {name!r} must be {kind.__name__}, got {type(value).__name__}"
        )
    return value


def optional_field(fields: dict, name: str, kind: type, default: Any) -> Any:
    return field(fields, name, kind) if name in fields else default
