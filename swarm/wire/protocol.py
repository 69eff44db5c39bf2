"""The wire protocol between clients and peers: every message that crosses the network.

A session is one persistent hivemind binary stream per (client, peer) hop. Each frame is

    u32 big-endian payload length | msgpack map

and every map carries `t` (the message type) and `v` (the protocol version). Tensors travel
as a map {dtype, shape, data} with the raw bytes in `data`. Nothing is ever pickled.

Push between peers: a client's STEP may carry a `chain` of next hops; the peer then sends its
output as a STEP straight to chain[0] (over its own stream to that peer), which answers
PUSH_ACK at once and later sends its STEP_RESULT to the session's client, and so on
(peer/push.py). A peer accepts a pushed STEP only for a session whose client named the
pushing peer as its `upstream` when opening it. A client's STEP marked `early` is answered as
soon as its output is computed (STEP_RESULT with `push_pending`), and the push's outcome follows
on the client's stream as a PUSH_ACK (code 0: the next peer took it), so the next peer's ack is
not on the token's path: a token through k peers crosses k + 1 links.

Disaggregated prefill and decode (HexGen-2): a client opens a *decode* session naming the peers
that will compute its prompt (`kv_from`), then a *prefill* session on each of those peers naming
where each of its layers' keys and values go (`kv_to`: a decode peer, its session, and the
layers). After the prefill step, the prefill peer sends the keys and values of consecutive
layers, a few per KV_PUSH, over its push link to the decode peer, which answers PUSH_ACK and
accepts them only from a peer of its `kv_from`; then the prefill peer answers the client. The
decode session starts at the prompt's length.

The messages are here; encoding them and reading and writing frames are in swarm/wire/frames.py,
whose `decode_*` functions validate everything and raise `ProtocolError` with an `ErrorCode`,
which the receiving side turns into an `Error` frame for the sender; a peer never crashes on
input.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from hexswarm.swarm.wire.checks import ErrorCode, ProtocolError  # noqa: F401  (the protocol's error: its users import it from here)

# 2: a signing peer's OPENED names the format it computes in, and its signed statements cover it
PROTOCOL_VERSION = 2
SESSION_PROTOCOL = "/hexswarm/session/1"  # hivemind stream handler name
DEFAULT_MAX_FRAME_BYTES = 64 << 20


class MsgType(enum.IntEnum):
    OPEN = 1  # client -> peer: start a session
    OPENED = 2  # peer -> client
    STEP = 3  # client -> peer: hidden states of new tokens
    STEP_RESULT = 4  # peer -> client
    CLOSE = 5  # client -> peer
    CLOSED = 6  # peer -> client
    PING = 7  # client -> peer: round-trip measurement, also before OPEN
    PONG = 8
    ERROR = 9  # peer -> client
    PUSH_ACK = 10  # peer -> peer: a pushed STEP (or KV_PUSH) was accepted (code 0) or refused;
    # peer -> client: after an early STEP_RESULT, whether its push was taken (code 0) or not
    KV_PUSH = 11  # prefill peer -> decode peer: consecutive layers' keys and values of a prompt
    ATTEST = 12  # client -> peer: sign the session's commitments up to now (swarm/wire/commitments.py)
    ATTESTED = 13


# ---------------------------------------------------------------- messages


@dataclass(frozen=True)
class Open:
    session_id: str
    model_id: str
    start: int  # blocks [start, end) this hop runs
    end: int
    max_length: int  # tokens per sequence the session may reach
    batch_size: int
    dtype: str  # dtype of the hidden states on the wire
    upstream: str = ""  # the one peer id whose pushed STEPs this session accepts ("" = none)
    kv_from: tuple[str, ...] = ()  # a decode session: the prefill peers whose KV_PUSHes it takes
    kv_to: tuple[KvTarget, ...] = ()  # a prefill session: where its layers' keys and values go
    prompt_length: int = 0  # a decode session: the prompt tokens its keys and values must hold (0: not said)


@dataclass(frozen=True)
class KvTarget:
    """Layers [start, end) of a prefill session's keys and values go to a decode peer's session."""

    peer_id: str
    session_id: str
    start: int
    end: int


@dataclass(frozen=True)
class Opened:
    session_id: str
    owner_marker: bytes = b""  # the peer's public key, which signs its commitments ("" if it does not)
    format: str = ""  # the format it computes in, which its signed statements name (with owner_marker)


@dataclass(frozen=True)
class NextHop:
    """Where a peer pushes its output: the next peer of the chain and that hop's session id."""

    peer_id: str  # base58
    session_id: str


@dataclass(frozen=True)
class Step:
    """From a client (on the session's own stream), or pushed by the session's upstream peer."""

    session_id: str
    position: int  # tokens of each sequence already in the cache; must equal the peer's count
    hidden: torch.Tensor  # (batch, new_tokens, hidden_size)
    chain: tuple[NextHop, ...] = ()  # push the output to chain[0], which pushes to chain[1], ...
    # How long a pusher waits for the next peer's PUSH_ACK. Set on every pushed step (it marks a
    # push: the answer is a PUSH_ACK) and on a client's step with a chain; 0 on other steps.
    ack_ms: int = 0
    # A pushed step: the client (peer id) whose session it feeds; sessions live in their
    # opener's namespace (peer/core.py), so a push names whose session it means.
    owner: str = ""
    # With a chain: answer the client as soon as the output is computed, before the next peer
    # acks the push (a STEP_RESULT with push_pending), then send the push's outcome as a PUSH_ACK
    # on the same stream. Carried on to every pushed step of the chain. False: the answer
    # waits for the ack and carries push_error (what peers and clients of before did).
    early: bool = False


@dataclass(frozen=True)
class StepResult:
    session_id: str
    hidden: torch.Tensor
    push_error: str = ""  # the step had a chain and the push to its first hop failed: why
    kv_error: str = ""  # a prefill session's keys and values did not all reach their decode peers: why
    digest: bytes = b""  # H(input), 8 bytes (swarm/wire/commitments.py); b"" from older peers
    signature: bytes = b""  # every SIGN_EVERY steps: the signed statement of the session so far
    push_pending: bool = False  # answered early (Step.early): a PUSH_ACK with the push's outcome follows


@dataclass(frozen=True)
class PushAck:
    session_id: str
    code: int = 0  # 0: accepted (the result goes to the session's client); else an ErrorCode
    message: str = ""


@dataclass(frozen=True)
class KvPush:
    """Keys and values of consecutive layers of a prompt, from its prefill peer to a decode session."""

    session_id: str  # the decode session
    layer: int  # global block index of the first layer
    keys: torch.Tensor  # (layers, batch, kv_heads, tokens, head_dim), in the compute dtype
    values: torch.Tensor
    owner: str = ""  # the client (peer id) that opened the decode session


@dataclass(frozen=True)
class Attest:
    session_id: str


@dataclass(frozen=True)
class Attested:
    session_id: str
    position: int  # the signed statement covers the session's steps up to here
    signature: bytes


@dataclass(frozen=True)
class Close:
    session_id: str


@dataclass(frozen=True)
class Closed:
    session_id: str


@dataclass(frozen=True)
class Ping:
    nonce: int


@dataclass(frozen=True)
class Pong:
    nonce: int


@dataclass(frozen=True)
class Error:
    code: ErrorCode
    message: str


Message = (
    Open
    | Opened
    | Step
    | StepResult
    | Close
    | Closed
    | Ping
    | Pong
    | Error
    | PushAck
    | KvPush
    | Attest
    | Attested
)

MAX_CHAIN = 64  # hops a pushed step may still travel
MAX_ACK_MS = 60_000
MAX_FORMAT_CHARS = 16  # a compute format's name in OPENED (float32, bfloat16, int8 ...)
