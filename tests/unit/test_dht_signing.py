"""swarm/dht_signing.py signs without hivemind; hivemind's own validator must accept it."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer

from hexswarm.swarm import dht_signing
from hexswarm.swarm.identity import load_or_create_identity
from hexswarm.swarm.wire_checks import ProtocolError


@pytest.fixture(scope="module")
def identity(tmp_path_factory):
    return load_or_create_identity(tmp_path_factory.mktemp("id") / "edge.key")


def _record(key: str, subkey: bytes, value: bytes, expiration: float) -> DHTRecord:
    return DHTRecord(
        DHTID.generate(source=key).to_bytes(), MSGPackSerializer.dumps(subkey), value, expiration
    )


def test_serialization_matches_hivemind():
    for obj in ("hexswarm/v1/models", b"\x00bytes", (b"a", b"b", b"c", 1.5)):
        assert dht_signing.hivemind_dumps(obj) == MSGPackSerializer.dumps(obj)
    assert dht_signing.dht_key_id("k") == DHTID.generate(source="k").to_bytes()


def test_hivemind_accepts_the_signature(identity):
    key = identity.private_key._private_key
    marker = dht_signing.owner_marker(key.public_key())
    assert marker == identity.owner_marker
    value = dht_signing.signed_value(key, "hexswarm/v1/models/m", marker, b"record", 1e9)
    validator = RSASignatureValidator(identity.private_key)
    assert validator.validate(_record("hexswarm/v1/models/m", marker, value, 1e9))
    assert MSGPackSerializer.loads(validator.strip_value(_record("x", marker, value, 1e9))) == b"record"


def test_hivemind_refuses_other_keys_and_changes(identity):
    marker = identity.owner_marker
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = dht_signing.signed_value(other, "hexswarm/v1/models/m", marker, b"record", 1e9)
    validator = RSASignatureValidator(identity.private_key)
    assert not validator.validate(_record("hexswarm/v1/models/m", marker, forged, 1e9))
    honest = dht_signing.signed_value(
        identity.private_key._private_key, "hexswarm/v1/models/m", marker, b"r", 1e9
    )
    assert not validator.validate(_record("hexswarm/v1/models/m", marker, honest, 2e9))  # expiration changed
    changed = _record("hexswarm/v1/models/m", marker, honest.replace(b"r", b"s", 1), 1e9)
    assert not validator.validate(dataclasses.replace(changed))


def test_announce_requests_round_trip_and_reject_garbage():
    entry = dht_signing.SignedEntry("k", b"[owner:x]", b"v", 12.5)
    frame = dht_signing.encode_announce([entry])
    assert dht_signing.decode_announce(frame[4:]) == [entry]
    for bad in (b"\xc1", b"\x80", dht_signing.encode_announce([entry])[4:].replace(b"\x01", b"\x07", 1)):
        with pytest.raises(ProtocolError):
            dht_signing.decode_announce(bad)
    assert dht_signing.decode_reply(dht_signing.encode_reply(2, members=("Qm1",))[4:]) == (2, "", ("Qm1",))
    with pytest.raises(ProtocolError):
        dht_signing.decode_reply(msgpack.packb({"v": 1, "stored": 1, "error": "", "members": [7]}))


def test_the_relay_checks_key_expiration_and_record(identity):
    import time

    from hexswarm.swarm.announce_relay import AnnounceRelay
    from hexswarm.swarm.records import MODELS_KEY, ModelEntry

    relay = AnnounceRelay(None, identity)
    key = identity.private_key._private_key
    marker, entry_bytes = identity.owner_marker, ModelEntry("m", 4).to_bytes()

    def entry(dht_key=MODELS_KEY, value=entry_bytes, expiration: float | None = None):
        expiration = time.time() + 30 if expiration is None else expiration
        return dht_signing.SignedEntry(
            dht_key, marker, dht_signing.signed_value(key, dht_key, marker, value, expiration), expiration
        )

    relay.check(entry())  # honest: no error
    for bad in (
        entry(dht_key="other/key"),
        entry(expiration=time.time() + 10_000),
        entry(expiration=time.time() - 1),
    ):
        with pytest.raises(ProtocolError):
            relay.check(bad)
    with pytest.raises(ProtocolError, match="no hexswarm record"):
        relay.check(entry(dht_key=MODELS_KEY + "/m", value=b"junk"))
