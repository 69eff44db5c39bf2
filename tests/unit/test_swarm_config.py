"""Where a node finds the swarm, and how missing blocks are named."""

import pytest

from client.swarm_client import MissingBlocksError, uncovered_blocks
from swarm.dht import INITIAL_PEERS_ENV, public_initial_peers
from swarm.records import PeerRecord, PeerState


def test_public_peers_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(INITIAL_PEERS_ENV, "/ip4/1.2.3.4/tcp/1/p2p/QmA, /ip4/5.6.7.8/tcp/2/p2p/QmB")
    assert public_initial_peers() == ["/ip4/1.2.3.4/tcp/1/p2p/QmA", "/ip4/5.6.7.8/tcp/2/p2p/QmB"]


def test_no_public_peers_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(INITIAL_PEERS_ENV, raising=False)
    monkeypatch.setattr("swarm.dht.PUBLIC_INITIAL_PEERS", ())
    with pytest.raises(SystemExit, match=INITIAL_PEERS_ENV):
        public_initial_peers()


def _record(start, end):
    return PeerRecord(
        peer_id="Qm",
        name="p",
        model_id="m",
        start=start,
        end=end,
        state=PeerState.ONLINE,
        throughput=1.0,
        decode_ms_per_block=1.0,
        cache_tokens_left=1,
        open_sessions=0,
        max_length=1,
        dtype="float32",
        device="cpu",
        version="0",
    )


def test_uncovered_blocks_and_their_message():
    records = [_record(0, 3), _record(5, 6)]
    assert uncovered_blocks(records, 9) == [3, 4, 6, 7, 8]
    error = MissingBlocksError("m-1", uncovered_blocks(records, 9), 60)
    assert "blocks 3:5, 6:9 of m-1" in str(error)
