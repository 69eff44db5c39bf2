"""swarm/trust/dht_signing.py signs without hivemind; hivemind's own validator must accept it."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer

from hexswarm.swarm.net.identity import load_or_create_identity
from hexswarm.swarm.trust import dht_signing
from hexswarm.swarm.wire.checks import ProtocolError


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

    from hexswarm.swarm.nat.announce_relay import AnnounceRelay
    from hexswarm.swarm.trust.record_keys import RECORD_SHARDS, index_key, record_key, record_shard
    from hexswarm.swarm.trust.records import ModelEntry

    relay = AnnounceRelay(None, identity)
    key = identity.private_key._private_key
    marker, entry_bytes = identity.owner_marker, ModelEntry("m", 4).to_bytes()
    own = identity.peer_id.to_base58()
    own_index = index_key(own)
    other_shard = f"hexswarm/v1/model-index/{(record_shard(own) + 1) % RECORD_SHARDS}"

    def entry(dht_key=own_index, value=entry_bytes, expiration: float | None = None):
        expiration = time.time() + 30 if expiration is None else expiration
        return dht_signing.SignedEntry(
            dht_key, marker, dht_signing.signed_value(key, dht_key, marker, value, expiration), expiration
        )

    relay.check(entry())  # honest: no error
    for bad in (
        entry(dht_key="other/key"),
        entry(dht_key=other_shard),  # its shard is fixed by its id (swarm/trust/record_keys.py)
        entry(expiration=time.time() + 10_000),
        entry(expiration=time.time() - 1),
    ):
        with pytest.raises(ProtocolError):
            relay.check(bad)
    with pytest.raises(ProtocolError, match="no hexswarm record"):
        relay.check(entry(dht_key=record_key("m", own), value=b"junk"))


class _Remote:
    """What a stream handler is told of its remote: its peer id."""

    def __init__(self, peer_id: str):
        self.peer_id = type("PeerId", (), {"to_base58": lambda _self: peer_id})()


class _Writer:
    def __init__(self):
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        pass


def _reply(writer: _Writer) -> tuple[int, str, tuple[str, ...]]:
    return dht_signing.decode_reply(writer.data[4:])


@pytest.mark.asyncio
async def test_the_relay_takes_only_a_senders_own_records_one_at_a_time_at_a_bounded_rate(identity):
    import asyncio
    import time

    from hexswarm.swarm.nat import announce_relay
    from hexswarm.swarm.nat.announce_relay import AnnounceRelay
    from hexswarm.swarm.trust.record_keys import index_key
    from hexswarm.swarm.trust.records import ModelEntry

    relay = AnnounceRelay(None, identity)
    expiration = time.time() + 30
    index = index_key(identity.peer_id.to_base58())
    value = dht_signing.signed_value(
        identity.private_key._private_key,
        index,
        identity.owner_marker,
        ModelEntry("m", 4).to_bytes(),
        expiration,
    )
    request = dht_signing.encode_announce(
        [dht_signing.SignedEntry(index, identity.owner_marker, value, expiration)]
    )

    async def ask(sender: str, data: bytes | None = request) -> tuple[int, str, tuple[str, ...]]:
        reader, writer = asyncio.StreamReader(), _Writer()
        if data is not None:
            reader.feed_data(data)
        await relay.handle_stream(_Remote(sender), reader, writer)
        return _reply(writer)

    stored, why, _ = await ask("QmSomeoneElse")  # a valid record, but not the sender's own
    assert stored == 0 and "only its own records" in why

    trickling = asyncio.create_task(ask("QmTrickler", data=b""))  # holds its read open
    await asyncio.sleep(0.05)
    _, why, _ = await ask("QmTrickler")
    assert "one announcement at a time" in why
    assert relay.busy == 0  # a request being read holds no relaying slot
    trickling.cancel()

    reasons = [
        (await ask(f"QmFlood{i // 100}"))[1] for i in range(announce_relay.REQUESTS_PER_MINUTE * 2 + 1)
    ]
    assert "announcements a minute" in reasons[-1] and not any("a minute" in r for r in reasons[:-1])
