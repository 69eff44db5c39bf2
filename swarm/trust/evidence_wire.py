"""How evidence of a lie travels: peers re-check it, keep it, and say so in the DHT.

Evidence (swarm/trust/evidence.py) is proof only to whoever recomputes it, so it is never trusted
on anyone's word. It moves like this:

1. A client that proved a lie submits the evidence to peers that serve the liar's blocks, on
   EVIDENCE_PROTOCOL. Each one re-checks it by recomputing the blocks itself (peer/
   evidence_service.py), with bounded work per request and per remote and IP group.
2. A peer that found the lie proven bans the liar, keeps the evidence, and announces in the
   DHT that it holds it (`Holding`, under one key per model, a subkey per holder and liar).
3. Any client reading those announcements fetches the evidence from a holder (GET) and re-checks
   it itself: two peers from other IP groups recompute the inputs (client/evidence_sync.py).
   Only then does it ban the liar. An announcement is a pointer, never a verdict, so Sybils
   announcing a thousand holdings cost a reader at most a bounded number of re-checks.

Frames are length-prefixed msgpack maps (swarm/wire/protocol.py `framed`), one request and one reply
per stream: {"op": "submit", "evidence": bytes} -> {"verdict": str, "detail": str};
{"op": "get", "digest": hex} -> {"evidence": bytes}; any refusal -> {"error": str, "code": int}.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import asdict, dataclass
from typing import Any

import msgpack

from hexswarm.swarm.net.dht_read import get_latest
from hexswarm.swarm.trust.records import parse_signed_entries, unpack_map
from hexswarm.swarm.wire.frames import framed, read_payload

EVIDENCE_PROTOCOL = "/hexswarm/evidence/1"
HOLDINGS_KEY = "hexswarm/v1/evidence"
HOLDING_TTL_S = 24 * 3600.0
MAX_WIRE_EVIDENCE_BYTES = 64 << 20  # larger evidence is re-checked offline (hexswarm recheck)
MAX_REQUEST_HEADER_BYTES = 4096  # a GET, or anything before the evidence's bytes

PROVEN = "proven"  # the signed output is wrong: the peer recomputed it
NOT_PROVEN = "not_proven"  # the signed output holds up
CANNOT_CHECK = "cannot_check"  # not this peer's blocks or format; it says nothing either way
VERDICTS = (PROVEN, NOT_PROVEN, CANNOT_CHECK)
_DIGEST = re.compile(r"[0-9a-f]{64}")


class EvidenceRefused(Exception):
    """The other side refused a request (busy, rate-limited, malformed); `code` says which."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Holding:
    """A peer's statement that it re-checked evidence against `liar` and holds it."""

    holder: str  # the announcing peer (checked against the subkey's key by readers)
    liar: str
    digest: str  # sha256 of the evidence bytes (what GET asks for)
    start: int
    end: int
    size: int  # bytes

    def to_bytes(self) -> bytes:
        return msgpack.packb(asdict(self), use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: Any) -> Holding:
        body = unpack_map(data, max_bytes=2048)
        try:
            holding = cls(**body)
        except TypeError as e:
            raise ValueError(f"malformed holding: {e}") from None
        for name in ("holder", "liar", "digest"):
            if not isinstance(getattr(holding, name), str):
                raise ValueError(f"holding field {name} is not a string")
        if not _DIGEST.fullmatch(holding.digest):
            raise ValueError("a holding names its evidence by sha256")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (holding.start, holding.end)):
            raise ValueError("a holding's blocks are ints")
        if not 0 <= holding.start < holding.end or not 0 < holding.size <= MAX_WIRE_EVIDENCE_BYTES:
            raise ValueError("a holding's blocks or size are out of range")
        return holding


def holdings_key(model_id: str) -> str:
    return f"{HOLDINGS_KEY}/{model_id}"


def publish_holding(dht, owner_marker: bytes, model_id: str, holding: Holding, expiration: float):
    """Stores `holding` under the holder's key (one entry per holder and liar); hivemind's future."""
    subkey = owner_marker + b"/" + holding.liar.encode()
    return dht.store(
        holdings_key(model_id), holding.to_bytes(), expiration, subkey=subkey, return_future=True
    )


def read_holdings(dht, model_id: str, timeout: float | None = None) -> list[Holding]:
    """Every well-formed holding of `model_id` announced by the peer it names as holder."""
    value = get_latest(dht, holdings_key(model_id), timeout)
    return [
        h for owner, h in parse_signed_entries(value, Holding.from_bytes, _owner_prefix) if h.holder == owner
    ]


def _owner_prefix(subkey: bytes) -> bytes:
    end = subkey.find(b"]")
    if not subkey.startswith(b"[owner:") or end < 0:
        raise ValueError("holding subkey has no owner marker")
    return subkey[: end + 1]


def encode_message(body: dict) -> bytes:
    return framed(msgpack.packb(body, use_bin_type=True))


def decode_message(payload: bytes) -> dict:
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=True, max_bin_len=len(payload))
    except Exception:
        raise ValueError("not msgpack") from None
    if not isinstance(body, dict):
        raise ValueError("not a map")
    return body


async def call(dialer, peer_id: str, request: dict, timeout: float) -> dict:
    """One request to `peer_id`'s evidence service; its reply map. EvidenceRefused if it refused,
    TimeoutError or ConnectionError if it did not answer in time."""

    async def exchange() -> dict:
        reader, writer = await dialer.open_stream(peer_id, EVIDENCE_PROTOCOL)
        try:
            writer.write(encode_message(request))
            await writer.drain()
            return decode_message(await read_payload(reader, MAX_WIRE_EVIDENCE_BYTES + 4096))
        finally:
            writer.close()

    try:
        reply = await asyncio.wait_for(exchange(), timeout)
    except (asyncio.IncompleteReadError, ValueError) as e:
        raise ConnectionError(f"bad reply: {e}") from None
    if "error" in reply:
        raise EvidenceRefused(str(reply["error"])[:300], int(reply.get("code", 0) or 0))
    return reply
