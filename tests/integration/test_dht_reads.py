"""Reads of a model's records see every peer's record, and no copy of a node's own answers them.

Readers ask only the nodes nearest the model's key (swarm/net/dht_read.py), and writers store
without a search that pulls the key's value (swarm/net/replicas.py). A read is only as fresh
as the replicas if no node answers from a copy of its own: a reader's cache of its last read,
or what a client-mode node stored itself, would hide every peer that announced since
(swarm/net/dht.py turns hivemind's caches off; swarm/net/dht_process.py keeps client-mode
nodes from storing on themselves). Real DHT nodes: a bootstrap and one more server node hold
the key; writers and the reader are client-mode nodes, as peers behind NAT and clients are.
"""

import asyncio

import pytest
from hivemind.utils import get_dht_time

from hexswarm.swarm.net.dht import start_dht
from hexswarm.swarm.net.dht_process import shutdown_dht
from hexswarm.swarm.net.dht_read import get_latest
from hexswarm.swarm.net.identity import load_or_create_identity
from hexswarm.swarm.net.replicas import store_own
from hexswarm.swarm.tools.launcher import LocalSwarm
from hexswarm.swarm.trust.record_keys import index_key, record_key
from hexswarm.swarm.trust.records import ModelEntry, read_models, read_peer_records
from tests.unit.record_cases import make_record

pytestmark = pytest.mark.integration

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


@pytest.fixture(scope="module")
def initial_peers(tmp_path_factory):
    """A bootstrap and a second server node: two replicas of every key."""
    with LocalSwarm(tmp_path_factory.mktemp("reads")) as local:
        peers = local.start_bootstrap()
        server = start_dht(peers, load_or_create_identity(None), host_maddrs=LOOPBACK)
        try:
            yield peers
        finally:
            shutdown_dht(server, 5)


@pytest.fixture
def nodes(initial_peers):
    started = []

    def client_node():
        identity = load_or_create_identity(None)
        dht = start_dht(initial_peers, identity, client_mode=True, listen=False)
        started.append(dht)
        return dht, identity

    yield client_node
    for dht in started:
        shutdown_dht(dht, 5)


def announce(dht, identity, model_id: str, name: str) -> None:
    """Stores a signed record of `model_id` as a peer's Announcer does (on the nearest nodes it
    found, swarm/net/replicas.py), and its models entry through hivemind's own store."""
    record = make_record(peer_id=identity.peer_id.to_base58(), name=name, model_id=model_id)
    expiration, subkey = get_dht_time() + 60, identity.owner_marker
    key = record_key(model_id, record.peer_id)
    took = asyncio.run(store_own(dht, key, subkey, record.to_bytes(), expiration))
    assert took == 2, "both server nodes, and not the client-mode writer itself"
    assert dht.store(index_key(record.peer_id), ModelEntry(model_id, 4).to_bytes(), expiration, subkey=subkey)


def names(dht, model_id: str) -> set[str]:
    return {r.name for r in read_peer_records(dht, model_id, timeout=10)}


def test_a_peer_announced_after_a_read_is_in_the_next_read(nodes):
    reader, first, second = nodes(), nodes(), nodes()
    announce(*first, "model-a", "first")
    assert names(reader[0], "model-a") == {"first"}
    announce(*second, "model-a", "second")
    # A cached copy of the first read would answer alone here, without "second".
    assert names(reader[0], "model-a") == {"first", "second"}
    assert read_models(reader[0], 10).get("model-a") == 4


def test_a_writer_reads_the_others_not_only_what_it_stored_itself(nodes):
    writer, other = nodes(), nodes()
    announce(*other, "model-b", "other")
    announce(*writer, "model-b", "writer")
    # A copy of its own store in the writer's cache or storage would hold only its own record.
    assert names(writer[0], "model-b") == {"other", "writer"}
    for _, identity in (writer, other):  # each models entry, stored through hivemind's store
        entries = get_latest(writer[0], index_key(identity.peer_id.to_base58()), 10, every_node=False).value
        assert identity.owner_marker in entries


def test_a_record_stored_again_replaces_the_last_on_every_replica(nodes):
    """The second store reuses the nearest nodes the first one found (no search)."""
    writer, reader = nodes(), nodes()
    announce(*writer, "model-c", "before")
    announce(*writer, "model-c", "after")
    assert names(reader[0], "model-c") == {"after"}
