"""Signs DHT values the way hivemind's RSASignatureValidator checks them, without hivemind.

An edge peer (peer/edge/) cannot import hivemind, yet its record must carry its own signature
so that every DHT node accepts it and nobody else can write it. hivemind protects a subkey
`[owner:<ssh-rsa public key>]`: a value stored under it must end with
`[signature:<base64 RSA-PSS-SHA256 signature>]` over the msgpack of the record

    (sha1(msgpack(key)) as 20 bytes, msgpack(subkey), msgpack(value), expiration)

as hivemind's MSGPackSerializer writes it (a tuple is msgpack ext type 0x40 around a list).
tests/unit/test_dht_signing.py checks these bytes against hivemind's own validator.

Also here: the edge peer's announce request to a relaying full node (swarm/nat/announce_relay.py),
so that both ends share one encoding.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass

import msgpack
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from hexswarm.swarm.wire.checks import ErrorCode, ProtocolError

ANNOUNCE_PROTOCOL = "/hexswarm/announce/1"  # an edge peer's signed records, to a full node
ANNOUNCE_VERSION = 1
MAX_ANNOUNCE_BYTES = 256 << 10  # one request: two records of at most 64 KB each, and headroom
MAX_RELAYED_TTL_S = 600.0  # a relayed entry expires within this (edge peers re-announce every period)
MAX_ENTRIES = 4
MAX_MEMBERS = 4096  # peer ids in a relay's reply
MAX_PEER_ID = 128  # characters of a base58 peer id (46 for RSA keys)
MAX_REPLY_BYTES = MAX_MEMBERS * (MAX_PEER_ID + 2) + 1024
_TUPLE_EXT = 0x40  # hivemind's MSGPackSerializer._TUPLE_EXT_TYPE_CODE
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)
_LENGTH = struct.Struct(">I")


def hivemind_dumps(obj) -> bytes:
    """msgpack as hivemind's MSGPackSerializer.dumps writes it, for bytes, str, numbers and tuples."""
    return msgpack.packb(obj, use_bin_type=True, strict_types=True, default=_tuple_ext)


def _tuple_ext(obj):
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUPLE_EXT, hivemind_dumps(list(obj)))
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def owner_marker(public_key: rsa.RSAPublicKey) -> bytes:
    """The `[owner:ssh-rsa ...]` subkey that only this key may write (swarm/net/identity.py)."""
    ssh = public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return b"[owner:" + ssh + b"]"


def dht_key_id(key: str) -> bytes:
    """hivemind's DHTID of a key, as the 20 bytes a record is signed with."""
    return hashlib.sha1(hivemind_dumps(key)).digest()


def signed_value(
    private_key: rsa.RSAPrivateKey, key: str, subkey: bytes, value: bytes, expiration: float
) -> bytes:
    """The stored bytes of `value` under (key, subkey): its msgpack with the owner's signature."""
    value_bytes = hivemind_dumps(value)
    record = hivemind_dumps((dht_key_id(key), hivemind_dumps(subkey), value_bytes, float(expiration)))
    signature = base64.b64encode(private_key.sign(record, _PSS, hashes.SHA256()))
    return value_bytes + b"[signature:" + signature + b"]"


@dataclass(frozen=True)
class SignedEntry:
    """One DHT entry as an edge peer hands it to a relay: already signed by its owner."""

    key: str
    subkey: bytes  # the owner marker
    value: bytes  # signed_value(...): msgpack of the value, then the signature
    expiration: float  # DHT time (seconds since the epoch)


def encode_announce(entries: list[SignedEntry]) -> bytes:
    """One length-prefixed announce request."""
    body = {"v": ANNOUNCE_VERSION, "entries": [[e.key, e.subkey, e.value, e.expiration] for e in entries]}
    payload = msgpack.packb(body, use_bin_type=True)
    return _LENGTH.pack(len(payload)) + payload


def decode_announce(payload: bytes) -> list[SignedEntry]:
    """The entries of an announce request; ProtocolError for anything malformed."""
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=True, max_bin_len=MAX_ANNOUNCE_BYTES)
    except Exception as e:
        raise ProtocolError(ErrorCode.MALFORMED, f"not msgpack: {type(e).__name__}") from None
    if not isinstance(body, dict) or body.get("v") != ANNOUNCE_VERSION:
        raise ProtocolError(ErrorCode.VERSION, f"announce requests are version {ANNOUNCE_VERSION}")
    raw = body.get("entries")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_ENTRIES:
        raise ProtocolError(ErrorCode.MALFORMED, f"entries must be a list of 1 to {MAX_ENTRIES}")
    return [_entry(item) for item in raw]


def _entry(item) -> SignedEntry:
    kinds = (str, bytes, bytes, float)
    if not isinstance(item, list) or len(item) != 4 or not all(map(isinstance, item, kinds)):
        raise ProtocolError(
            ErrorCode.MALFORMED, "an entry is [key: str, subkey: bytes, value: bytes, expiration: float]"
        )
    return SignedEntry(*item)


def encode_reply(stored: int, error: str = "", members: tuple[str, ...] = ()) -> bytes:
    """A relay's answer: on how many nodes the entries went, why not (if not), and the peer ids
    that announce the model now (whom the edge peer may push to, peer/push.py)."""
    body = {
        "v": ANNOUNCE_VERSION,
        "stored": stored,
        "error": error[:500],
        "members": list(members[:MAX_MEMBERS]),
    }
    payload = msgpack.packb(body)
    return _LENGTH.pack(len(payload)) + payload


def decode_reply(payload: bytes) -> tuple[int, str, tuple[str, ...]]:
    """(entries stored, why not all, member peer ids) from a relay's reply; ProtocolError if malformed."""
    try:
        body = msgpack.unpackb(payload, raw=False)
    except Exception:
        body = None
    if not (
        isinstance(body, dict) and isinstance(body.get("stored"), int) and isinstance(body.get("error"), str)
    ):
        raise ProtocolError(ErrorCode.MALFORMED, "a relay's reply is {v, stored: int, error: str, members}")
    members = body.get("members", [])
    if not isinstance(members, list) or len(members) > MAX_MEMBERS:
        raise ProtocolError(ErrorCode.MALFORMED, f"members must be a list of at most {MAX_MEMBERS} peer ids")
    if not all(isinstance(m, str) and 0 < len(m) <= MAX_PEER_ID for m in members):
        raise ProtocolError(ErrorCode.MALFORMED, "a member is not a peer id")
    return body["stored"], body["error"], tuple(members)
