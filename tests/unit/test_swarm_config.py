"""Where a node finds the swarm, and how missing blocks are named."""

from hexswarm.client.swarm_client import MissingBlocksError, uncovered_blocks
from hexswarm.swarm.net.dht import INITIAL_PEERS_ENV, public_coordinator_keys, public_initial_peers
from tests.unit.record_cases import make_record


def test_public_peers_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(INITIAL_PEERS_ENV, "/ip4/1.2.3.4/tcp/1/p2p/QmA, /ip4/5.6.7.8/tcp/2/p2p/QmB")
    assert public_initial_peers() == ["/ip4/1.2.3.4/tcp/1/p2p/QmA", "/ip4/5.6.7.8/tcp/2/p2p/QmB"]


def test_the_shipped_list_is_data_with_comments_and_coordinator_keys(monkeypatch, tmp_path):
    monkeypatch.delenv(INITIAL_PEERS_ENV, raising=False)
    listing = tmp_path / "public_peers.txt"
    listing.write_text("# comment\n/ip4/1.2.3.4/tcp/1/p2p/QmA\n\ncoordinator QmC\n")
    monkeypatch.setattr("hexswarm.swarm.net.dht.PUBLIC_PEERS_FILE", listing)
    assert public_initial_peers() == ["/ip4/1.2.3.4/tcp/1/p2p/QmA"]
    assert public_coordinator_keys() == ["QmC"]


def test_the_shipped_list_is_empty_until_a_public_swarm_runs(monkeypatch):
    monkeypatch.delenv(INITIAL_PEERS_ENV, raising=False)
    assert public_initial_peers() == []


def test_uncovered_blocks_and_their_message():
    records = [make_record(start=0, end=3), make_record(start=5, end=6)]
    assert uncovered_blocks(records, 9) == [3, 4, 6, 7, 8]
    error = MissingBlocksError("m-1", uncovered_blocks(records, 9), 60)
    assert "blocks 3:5, 6:9 of m-1" in str(error)
