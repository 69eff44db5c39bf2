"""Nobody can overwrite another peer's DHT record or announce one under its peer id."""

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.utils import get_dht_time

from hexswarm.swarm.net.dht import start_dht
from hexswarm.swarm.net.identity import load_or_create_identity
from hexswarm.swarm.trust.record_keys import RECORD_SHARDS, record_key, record_keys, record_shard
from hexswarm.swarm.trust.records import PeerRecord, PeerState, read_peer_records
from tests.integration.conftest import store_until_taken

pytestmark = pytest.mark.integration


@pytest.fixture
def attacker(swarm, tmp_path):
    identity = load_or_create_identity(tmp_path / "attacker.key")
    dht = start_dht(swarm.initial_peers, identity, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    yield dht, identity
    dht.shutdown()


def _victim(model, name="p1") -> PeerRecord:
    return next(r for r in read_peer_records(model.swarm.dht, model.spec.model_id) if r.name == name)


def _victim_subkey(model, victim: PeerRecord) -> bytes:
    value = model.swarm.dht.get(record_key(model.spec.model_id, victim.peer_id), latest=True).value
    from hexswarm.swarm.net.identity import peer_id_from_owner_marker

    return next(s for s in value if peer_id_from_owner_marker(s).to_base58() == victim.peer_id)


def _forged(victim: PeerRecord, **changes) -> bytes:
    fields = {**victim.__dict__, **changes}
    return PeerRecord(**fields).to_bytes()


def test_overwriting_another_peers_record_is_refused(model, attacker):
    dht, identity = attacker
    victim = _victim(model)
    subkey = _victim_subkey(model, victim)
    forged = _forged(victim, state=PeerState.LEAVING, start=0, end=6)
    expiration = get_dht_time() + 600

    # Unsigned (the attacker's validator signs only its own subkeys) ...
    key = record_key(model.spec.model_id, victim.peer_id)
    assert not dht.store(key, forged, expiration, subkey=subkey)
    # ... and signed with the attacker's key instead of the owner's.
    signature = identity.private_key.sign(forged)
    signed_wrong = forged + RSASignatureValidator.SIGNATURE_FORMAT.replace(b"_value_", signature)
    assert not dht.store(key, signed_wrong, expiration, subkey=subkey)

    after = _victim(model)  # both stores were refused: the record read now is the victim's own
    assert after.state == PeerState.ONLINE and (after.start, after.end) == (victim.start, victim.end)


def test_record_claiming_another_peers_id_is_ignored(model, attacker):
    dht, identity = attacker
    victim = _victim(model)
    key = record_key(model.spec.model_id, victim.peer_id)  # where readers look for the victim
    claim = _forged(victim, name="impostor", start=0, end=6)
    store_until_taken(dht, key, claim, identity.owner_marker)

    raw = model.swarm.dht.get(key, latest=True).value
    assert any(item.value == claim for item in raw.values())  # it is in the DHT, correctly signed ...
    names = {r.name for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
    assert "impostor" not in names  # ... but by a key that is not the claimed peer's, so readers drop it

    # Control: the same attacker announcing under its own id is accepted.
    own = _forged(victim, peer_id=identity.peer_id.to_base58(), name="attacker-own", state=PeerState.JOINING)
    store_until_taken(
        dht, record_key(model.spec.model_id, identity.peer_id.to_base58()), own, identity.owner_marker
    )
    names = {r.name for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
    assert "attacker-own" in names


def test_a_record_under_another_shard_than_its_signers_is_ignored(model, attacker):
    """A peer may store its own record under any key; readers take it only from its own
    shard, so one identity cannot put a copy in every shard to crowd others' reads."""
    dht, identity = attacker
    attacker_id = identity.peer_id.to_base58()
    victim = _victim(model)
    other_shard = (record_shard(attacker_id) + 1) % RECORD_SHARDS
    (key,) = record_keys(model.spec.model_id, [other_shard])
    copy = _forged(victim, peer_id=attacker_id, name="attacker-copy", state=PeerState.JOINING)
    store_until_taken(dht, key, copy, identity.owner_marker)
    assert any(item.value == copy for item in model.swarm.dht.get(key, latest=True).value.values())
    names = {r.name for r in read_peer_records(model.swarm.dht, model.spec.model_id)}
    assert "attacker-copy" not in names
