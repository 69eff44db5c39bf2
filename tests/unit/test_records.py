"""DHT records: schema, unknown fields, and the binding of peer ids to signing keys."""

import msgpack
import pytest

from hexswarm.swarm.net.identity import load_or_create_identity, peer_id_from_owner_marker
from hexswarm.swarm.trust.records import DeviceInfo, PeerRecord, PeerState, link_tag, links_by_peer
from tests.unit.record_cases import make_record

GPU = DeviceInfo(type="cuda", name="NVIDIA H100", memory_bytes=80 << 30, cores=132)


def test_round_trip_and_unknown_fields_ignored():
    record = make_record()
    assert PeerRecord.from_bytes(record.to_bytes()) == record
    body = msgpack.unpackb(record.to_bytes())
    body["from_the_future"] = [1, 2, 3]
    assert PeerRecord.from_bytes(msgpack.packb(body)) == record


def test_tensor_parallel_fields_round_trip():
    record = make_record(tp=2, devices=(GPU, GPU))
    assert PeerRecord.from_bytes(record.to_bytes()) == record


def test_tp_choices_round_trip_and_default_to_a_fixed_degree():
    record = make_record(
        tp=2, devices=(GPU, GPU), tp_choices=(1, 2, 4), tp_speeds=((1, 900.0, 3.5), (2, 1500.0, 2.25))
    )
    assert PeerRecord.from_bytes(record.to_bytes()) == record
    body = msgpack.unpackb(record.to_bytes())
    del body["tp_choices"], body["tp_speeds"]  # a peer from before the plan chose degrees
    older = PeerRecord.from_bytes(msgpack.packb(body))
    assert older.tp_choices == () and older.tp_speeds == ()


def test_uneven_split_fields_round_trip_and_default_to_even():
    record = make_record(
        tp=3,
        devices=(GPU, GPU, GPU),
        tp_partition="weight-stationary",
        tp_shares=((6, 704), (2, 640), (1, 192)),
        tp_predicted_step_ms=21.5,
        tp_observed_step_ms=23.0,
        tp_repartitions=1,
    )
    assert PeerRecord.from_bytes(record.to_bytes()) == record
    body = msgpack.unpackb(record.to_bytes())
    for name in (
        "tp_partition",
        "tp_shares",
        "tp_predicted_step_ms",
        "tp_observed_step_ms",
        "tp_repartitions",
    ):
        del body[name]  # a peer from before uneven splits
    older = PeerRecord.from_bytes(msgpack.packb(body))
    assert (older.tp_partition, older.tp_shares, older.tp_repartitions) == ("even", (), 0)


def test_the_partitions_a_record_may_name_are_heptis_modes():
    from hexswarm.routing.hepti.split import MODES
    from hexswarm.swarm.trust.records import TP_PARTITIONS

    assert TP_PARTITIONS == ("even", *MODES)


def test_record_without_tp_fields_reads_as_one_device():
    """A record from before tensor parallelism (no tp, no devices) still parses, at degree 1."""
    body = msgpack.unpackb(make_record().to_bytes())
    del body["tp"], body["devices"]
    record = PeerRecord.from_bytes(msgpack.packb(body))
    assert record.tp == 1 and record.devices == ()


def test_decode_batch_fields_round_trip_and_default_for_older_records():
    record = make_record(decode_batch_size=8, decode_batch_tokens_per_s=5000.0)
    assert PeerRecord.from_bytes(record.to_bytes()) == record
    body = msgpack.unpackb(record.to_bytes())
    del body["decode_batch_size"], body["decode_batch_tokens_per_s"]  # a peer from before batching
    older = PeerRecord.from_bytes(msgpack.packb(body))
    assert older.decode_batch_size == 1 and older.decode_batch_tokens_per_s == 0.0


def test_relay_slots_free_round_trip_and_default_to_not_stated():
    record = make_record(relay_slots_free=117)
    assert PeerRecord.from_bytes(record.to_bytes()).relay_slots_free == 117
    body = msgpack.unpackb(record.to_bytes())
    del body["relay_slots_free"]  # a peer from before it
    assert PeerRecord.from_bytes(msgpack.packb(body)).relay_slots_free == -1


def test_links_name_peers_by_tag_and_resolve_among_the_records_read():
    b = make_record(peer_id="QmB")
    links = ((link_tag("QmB"), 12.34), (link_tag("QmNotRead"), 5.0))
    a = PeerRecord.from_bytes(make_record(peer_id="QmA", links=links).to_bytes())
    assert a.links == ((link_tag("QmB"), 12.3), (link_tag("QmNotRead"), 5.0))  # to a tenth of a ms
    assert links_by_peer([a, b]) == [("QmA", [("QmB", 12.3)]), ("QmB", [])]
    body = msgpack.unpackb(a.to_bytes())
    assert [len(tag) for tag, _ in body["links"]] == [8, 8]  # 10 bytes a peer, not a 53-byte id
    body["rtt_ms"] = [["QmB", 1.0]]  # a peer from before links: its round trips are not read
    del body["links"]
    assert PeerRecord.from_bytes(msgpack.packb(body)).links == ()


def test_weight_format_round_trips_and_defaults_to_full_precision_for_older_records():
    record = make_record(quant="int8", weight_bytes_per_block=3_400_000)
    assert PeerRecord.from_bytes(record.to_bytes()) == record
    body = msgpack.unpackb(record.to_bytes())
    del body["quant"], body["weight_bytes_per_block"]  # a peer from before quantized peers
    older = PeerRecord.from_bytes(msgpack.packb(body))
    assert older.quant == "none" and older.weight_bytes_per_block == 0


@pytest.mark.parametrize(
    "change",
    [
        {"decode_batch_size": 0},
        {"decode_batch_tokens_per_s": -1.0},
        {"decode_batch_tokens_per_s": "fast"},
        {"tp": 0},
        {"tp": "2"},
        {"tp": 3, "devices": [GPU.__dict__, GPU.__dict__]},
        {"tp": 1, "devices": [{"type": "cuda", "name": "x"}]},
        {"tp": 1, "devices": ["cuda"]},
        {"tp_choices": [2, 1]},
        {"tp_choices": [1, 1]},
        {"tp_choices": [0, 1]},
        {"tp_choices": [1, 65]},
        {"tp_choices": [True]},
        {"tp_choices": "1,2"},
        {"tp_choices": list(range(1, 66))},
        {"tp": 1, "tp_choices": [2, 4]},
        {"tp_speeds": [[1, 900.0]]},
        {"tp_speeds": [[0, 900.0, 3.5]]},
        {"tp_speeds": [[1, 0, 3.5]]},
        {"tp_speeds": [[1, 900.0, -1.0]]},
        {"tp_speeds": [[1, 900.0, True]]},
        {"tp_speeds": [[2, 900.0, 3.5], [1, 900.0, 3.5]]},
        {"tp_speeds": [[1, 900.0, 3.5], [1, 900.0, 3.5]]},
        {"tp_speeds": "fast"},
        {"tp_partition": "lopsided"},
        {"tp_partition": 3},
        {"tp": 2, "devices": [], "tp_shares": [[4, 64]]},  # one share for two ranks
        {"tp": 1, "tp_shares": [[0, 64]]},
        {"tp": 1, "tp_shares": [[4, -64]]},
        {"tp": 1, "tp_shares": [[4, 64.5]]},
        {"tp": 1, "tp_shares": [[True, 64]]},
        {"tp": 1, "tp_shares": [[4]]},
        {"tp_shares": "4,64"},
        {"tp_predicted_step_ms": float("nan")},
        {"tp_observed_step_ms": -1.0},
        {"tp_repartitions": -1},
    ],
)
def test_malformed_tp_fields_are_rejected(change):
    body = msgpack.unpackb(make_record().to_bytes())
    body.update(change)
    with pytest.raises(ValueError):
        PeerRecord.from_bytes(msgpack.packb(body))


@pytest.mark.parametrize(
    "change",
    [
        {"schema": 2},
        {"state": "dancing"},
        {"start": "0"},
        {"start": 5, "end": 2},
        {"throughput": None},
        # In range as types, out of range as values: each would reach the routers' arithmetic.
        {"throughput": 0.0},
        {"throughput": float("nan")},
        {"throughput": float("inf")},
        {"decode_ms_per_block": -1.0},
        {"decode_ms_per_block": float("nan")},
        {"open_sessions": -1},
        {"cache_tokens_left": -5},
        {"max_length": 0},
        {"end": 10**9},
        {"plan_version": 2**63},
        {"decode_batch_size": 0},
        {"decode_batch_tokens_per_s": float("nan")},
        {"next_start": 4, "next_end": 2},
        {"name": "x" * 300},
        {"addrs": ["/ip4/1.2.3.4"] * 40},
        {"auto": 1},
        {"links": [[b"x" * 9, 10]]},  # a tag of another length
        {"links": [[b"x" * 8, -1]]},
        {"links": [["x" * 8, 10]]},  # a tag as text
        {"tp": 1, "devices": [{"type": "cpu", "name": "c", "memory_bytes": -1, "cores": 2}]},
        {"quant": "fp8"},  # a format the reader does not know: its outputs are not what it asked for
        {"quant": 8},
        {"weight_bytes_per_block": -1},
        {"reachability": "teleported"},
        {"reachability": 1},
        {"relays": ["Qm" + "x" * 300]},
        {"relays": ["QmR"] * 40},
        {"relays": 5},
        {"relay_slots_free": -2},
        {"relay_slots_free": 1 << 17},
        {"relay_slots_free": 3.5},
    ],
)
def test_malformed_records_are_rejected(change):
    body = msgpack.unpackb(make_record().to_bytes())
    body.update(change)
    with pytest.raises(ValueError):
        PeerRecord.from_bytes(msgpack.packb(body))


def test_reachability_round_trips_and_defaults_to_unknown_for_older_records():
    record = make_record(reachability="relayed", relays=("QmRelay",), addrs=("/ip4/1.2.3.4/tcp/5/p2p/Qm123",))
    assert PeerRecord.from_bytes(record.to_bytes()) == record
    body = msgpack.unpackb(make_record().to_bytes())
    del body["reachability"], body["relays"]
    older = PeerRecord.from_bytes(msgpack.packb(body))
    assert (older.reachability, older.relays) == ("", ())


def test_not_msgpack_or_too_big_is_rejected():
    with pytest.raises(ValueError):
        PeerRecord.from_bytes(b"\xc1\xc1")
    with pytest.raises(ValueError):
        PeerRecord.from_bytes(b"\x00" * (65 * 1024))


def test_identity_is_stable_and_bound_to_its_owner_marker(tmp_path):
    path = tmp_path / "id.key"
    first, again = load_or_create_identity(path), load_or_create_identity(path)
    assert first.peer_id == again.peer_id
    assert peer_id_from_owner_marker(first.owner_marker) == first.peer_id
    other = load_or_create_identity(tmp_path / "other.key")
    assert peer_id_from_owner_marker(other.owner_marker) != first.peer_id


def test_bad_identity_file(tmp_path):
    bad = tmp_path / "bad.key"
    bad.write_bytes(b"not a key")
    with pytest.raises(ValueError, match="identity"):
        load_or_create_identity(bad)


def test_a_bad_record_drops_its_peer_alone_and_is_logged_once(caplog):
    from types import SimpleNamespace

    from hexswarm.swarm.trust.record_keys import record_key
    from hexswarm.swarm.trust.records import peer_records_from

    good, bad = load_or_create_identity(None), load_or_create_identity(None)
    good_record = make_record(peer_id=good.peer_id.to_base58())
    body = msgpack.unpackb(make_record(peer_id=bad.peer_id.to_base58()).to_bytes())
    body["throughput"] = float("nan")
    values: dict = {}  # both peers' keys; one key when their ids fall in the same shard
    for identity, data in ((good, good_record.to_bytes()), (bad, msgpack.packb(body))):
        key = record_key("m-1", identity.peer_id.to_base58())
        values.setdefault(key, SimpleNamespace(value={})).value[identity.owner_marker] = SimpleNamespace(
            value=data
        )
    for _ in range(3):
        assert peer_records_from(values, "m-1") == [good_record]
    warnings = [r for r in caplog.records if "ignoring an entry" in r.getMessage()]
    assert len(warnings) == 1 and bad.peer_id.to_base58()[-8:] in warnings[0].getMessage()


def test_a_joining_peer_may_announce_before_it_has_measured():
    record = make_record(state=PeerState.JOINING, throughput=0.0)
    assert PeerRecord.from_bytes(record.to_bytes()) == record


@pytest.mark.parametrize(
    "body",
    [
        {"model_id": "m-1", "num_blocks": 10**12},  # status and the monitor size tables by it
        {"model_id": "m-1", "num_blocks": 0},
        {"model_id": "m-1", "num_blocks": True},
        {"model_id": "x" * 300, "num_blocks": 4},
    ],
)
def test_malformed_model_entries_are_rejected(body):
    from hexswarm.swarm.trust.records import ModelEntry

    with pytest.raises(ValueError):
        ModelEntry.from_bytes(msgpack.packb({**body, "schema": 1}))


def test_a_models_block_count_is_the_one_most_signers_announce():
    from hexswarm.swarm.trust.records import ModelEntry, models_from

    honest = [(f"Qm{i}", ModelEntry("m-1", 30)) for i in range(2)]
    hostile = [("QmX", ModelEntry("m-1", 100_000)), ("QmX", ModelEntry("other-2", 8))]
    assert models_from(hostile[:1] + honest + hostile[1:]) == {"m-1": 30, "other-2": 8}
    assert models_from([("QmA", ModelEntry("m-1", 30)), ("QmB", ModelEntry("m-1", 31))]) == {"m-1": 30}


def test_record_keys_spread_peers_over_shards_and_name_their_model():
    from hexswarm.swarm.trust.record_keys import (
        RECORD_SHARDS,
        index_key,
        model_of_key,
        record_key,
        record_keys,
        shard_of_key,
    )

    ids = [load_or_create_identity(None).peer_id.to_base58() for _ in range(64)]
    shards = {shard_of_key(record_key("m-1", peer_id)) for peer_id in ids}
    assert len(shards) > RECORD_SHARDS // 2  # 64 ids land on most of the 32 shards
    assert all(record_key("m-1", p) in record_keys("m-1") for p in ids)
    assert all(shard_of_key(index_key(p)) == shard_of_key(record_key("m-1", p)) for p in ids)
    assert model_of_key(record_key("m-1", ids[0])) == "m-1" and model_of_key(index_key(ids[0])) is None
    for bad in ("hexswarm/v1/models/m-1", "hexswarm/v1/models/m-1/32", "hexswarm/v1/models/m/1/2", "x/3"):
        assert model_of_key(bad) is None, bad
