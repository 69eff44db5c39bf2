"""What peers announce in the DHT, and how anyone reads it back.

Each peer signs one PeerRecord per model it serves and one ModelEntry, each under a subkey that
names its public key, in keys spread by its peer id (swarm/trust/record_keys.py says where).

Values carry a schema version; readers skip records they cannot parse, records whose peer id
is not the one of the key that signed them, and fields they do not know. A new field with a
default (like `tp`, `devices` and `decode_batch_tokens_per_s`) keeps the schema version, so older readers still read newer
records and newer readers fill in the default for older ones; the version changes only when
a field changes meaning or goes away in a way older readers would misread. (`rtt_ms`, round
trips by peer id, went away for `links`, by tag: an older reader reads no round trips, its
default, and prices links as if the client relayed them.)

Beside it: the bounds a record's fields are parsed to (swarm/trust/record_checks.py) and reading a
dictionary of signed entries (swarm/trust/signed_entries.py). This module stays where every role
imports them from, `unpack_map`, `parse_signed_entries`, `warn_once` and `TP_PARTITIONS`
included.
"""

from __future__ import annotations

import enum
import hashlib
import ipaddress
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import msgpack

from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT, QUANT_FORMATS
from hexswarm.swarm.trust.record_checks import (
    FLOAT_RANGES,
    INT_RANGES,
    LINK_TAG_BYTES,
    MAX_ADDRS,
    MAX_BLOCKS,
    MAX_COUNT,
    MAX_SESSIONS,
    MAX_TEXT,
    REACHABILITY,
    TEXT_FIELDS,
    TP_PARTITIONS,
    check_text,
    is_int,
    is_number,
    parse_links,
    parse_tp_choices,
    parse_tp_shares,
    parse_tp_speeds,
    unpack_map,
)
from hexswarm.swarm.trust.record_keys import index_key, index_keys, record_key, record_keys, record_shard
from hexswarm.swarm.trust.signed_entries import parse_signed_entries, warn_once

RECORD_SCHEMA_VERSION = 1
ROLES = ("both", "prefill", "decode")  # what a peer serves of a request (PeerRecord.role)


class PeerState(enum.StrEnum):
    JOINING = "joining"  # loading layers, not serving yet
    ONLINE = "online"
    LEAVING = "leaving"  # finishing open sessions, refusing new ones
    GONE = "gone"  # a clean exit's last word: readers drop the record at once, not when it expires


@dataclass(frozen=True)
class DeviceInfo:
    """One device of a peer (one tensor-parallel rank), as read from the hardware."""

    type: str  # "cuda" or "cpu"
    name: str  # e.g. "NVIDIA H100 80GB HBM3", or the CPU model
    memory_bytes: int  # GPU memory; for a CPU rank, the machine's RAM
    cores: int  # GPU multiprocessors; for a CPU rank, the cores (threads) it computes with

    @classmethod
    def from_dict(cls, body: Any) -> DeviceInfo:
        if not isinstance(body, dict):
            raise ValueError("a device entry is not a map")
        types = {"type": str, "name": str, "memory_bytes": int, "cores": int}
        for name, kind in types.items():
            if not isinstance(body.get(name), kind) or isinstance(body.get(name), bool):
                raise ValueError(f"device field {name} is missing or has the wrong type")
        if len(body["type"]) > MAX_TEXT or len(body["name"]) > MAX_TEXT:
            raise ValueError(f"device type and name must be at most {MAX_TEXT} characters")
        if not (0 <= body["memory_bytes"] <= MAX_COUNT and 0 <= body["cores"] <= MAX_SESSIONS):
            raise ValueError("device memory or cores out of range")
        return cls(**{name: body[name] for name in types})


def link_tag(peer_id: str) -> str:
    """How a record's `links` name a peer: the first LINK_TAG_BYTES bytes of a hash of its id, in
    hex. 10 bytes on the wire, not a peer id's 53; two ids that share a tag would take grinding
    ~2^64 keys, and would only blur the round trip a record claims to one of them."""
    return hashlib.sha256(peer_id.encode()).digest()[:LINK_TAG_BYTES].hex()


def links_by_peer(records: Sequence[PeerRecord]) -> list[tuple[str, list[tuple[str, float]]]]:
    """(peer id, [(other peer id, ms)]) of each record: its links whose tag names one of `records`
    (routing/chains/peer_links.py and the coordinator's view read links between peer ids)."""
    ids = {link_tag(r.peer_id): r.peer_id for r in records}
    return [(r.peer_id, [(ids[tag], ms) for tag, ms in r.links if tag in ids]) for r in records]


@dataclass(frozen=True)
class PeerRecord:
    """One peer's announcement for one model."""

    peer_id: str  # base58 libp2p id; must match the key that signed the record
    name: str  # human-friendly, chosen by the operator
    model_id: str
    start: int  # serves blocks [start, end)
    end: int
    state: PeerState
    throughput: float  # tokens/s through one block in a batched prefill (measured at start)
    decode_ms_per_block: float  # one-token decode step through one block (measured at start)
    cache_tokens_left: int  # KV-cache tokens a new session can still reserve
    open_sessions: int
    max_length: int  # longest sequence a session may reach
    dtype: str
    device: str
    version: str  # hexswarm version
    addrs: tuple[str, ...] = ()  # multiaddrs, for people reading status
    tp: int = 1  # tensor-parallel degree: how many devices share each layer (throughput is the group's)
    devices: tuple[DeviceInfo, ...] = ()  # one per rank, rank 0 first
    # Coordinator fields (swarm/coordinator/): where the peer is, how far others are, and whether
    # a plan may move it. Defaults keep the schema version (see the module docstring).
    region: str = ""  # the operator's --region label ("" = unknown: inferred from round trips)
    # (link_tag of a peer, smoothed round trip in ms) to a sample of peers (peer/link_probe.py); a
    # tag, not the peer id, since 32 of these rode in every record: 2 of its 3.4 KB as peer ids.
    links: tuple[tuple[str, float], ...] = ()
    auto: bool = False  # started with --layers auto: the plan (or Petals' rule) chooses its range
    max_blocks: int = 0  # most blocks it can hold (0 = not stated)
    plan_version: int = 0  # version of the coordinator's plan it follows (0 = none)
    next_start: int = 0  # a range it is loading to move to (joining), [next_start, next_end); 0:0 = none
    next_end: int = 0
    # Decode capacity when the peer batches steps of many sessions (peer/scheduler.py): tokens/s
    # through one block with `decode_batch_size` sessions stepping together. 0 = not announced
    # (an older peer): read it as 1000 / decode_ms_per_block, one session at a time.
    decode_batch_size: int = 1
    decode_batch_tokens_per_s: float = 0.0
    # `--layers auto --tp auto`: the tensor-parallel degrees this peer can serve at over the
    # devices it offers (each divides the model's heads and MLP width; `tp` is one of them), so
    # the plan chooses the degree too. () = the degree is fixed at `tp`.
    tp_choices: tuple[int, ...] = ()
    # ... and what it measured at each degree it has run: (degree, prefill tokens/s per block,
    # decode ms per block); its full degree and degree 1 at start, others once it serves at them.
    # The coordinator reads a rank's speed and the cost of its all-reduce from them.
    tp_speeds: tuple[tuple[int, float, float], ...] = ()
    # The format its blocks' linear weights are stored in (routing/scheduler/weight_formats.py):
    # clients route only through formats they accept, replay a failed span only onto the same
    # format, and verify a peer only against peers of its format. A format the reader does not
    # know drops the record (its outputs could be anything the reader did not ask for).
    quant: str = DEFAULT_QUANT
    weight_bytes_per_block: int = 0  # bytes one block's weights take on this peer (0 = not stated)
    # Disaggregated prefill and decode (HexGen-2): which phase clients should send here. A
    # `prefill` peer computes prompts and sends their keys and values to `decode` peers; `both`
    # (every peer before roles existed) serves whole requests. A client routes by it.
    role: str = "both"
    # How a tensor-parallel group splits each layer (Hepti, peer/tp/partition.py): "even" (1/tp
    # each) or the mode of its uneven split; the (heads, MLP columns) of each rank, rank 0 first;
    # the split's predicted and the group's observed decode step over all its blocks; how many
    # times it has re-partitioned from what it observed.
    tp_partition: str = "even"
    tp_shares: tuple[tuple[int, int], ...] = ()
    tp_predicted_step_ms: float = 0.0
    tp_observed_step_ms: float = 0.0
    tp_repartitions: int = 0
    # Whether others can dial it (peer/reachability.py): "direct", "relayed" (its `addrs` are
    # relay circuits, through the relays' peer ids in `relays`), or "unreachable" (it stays
    # joining and says why); "" from a peer that predates the check.
    reachability: str = ""
    relays: tuple[str, ...] = ()
    # The IP group (/24, /48) its dial-back helpers saw it connect from: what routers group a
    # relayed peer by, whose addresses are its relays' (client/group_cap.py); "" when unknown.
    observed_group: str = ""
    # Relay slots it would still give peers behind NAT (swarm/nat/port_relay.py), so that they
    # spread over direct peers by what each can take (peer/reachability.py); -1: not stated
    # (a peer that predates it). A claim, not a promise: readers cap what they believe of it.
    relay_slots_free: int = -1
    schema: int = RECORD_SCHEMA_VERSION

    def ends_a_hop_at(self, boundary: int) -> bool:
        """Whether a chain's hop on this peer can end at block `boundary`, pushing its output to
        a peer whose range starts there (it serves the block just before)."""
        return self.start < boundary <= self.end

    def to_bytes(self) -> bytes:
        body = asdict(self)
        body["tp_shares"] = [list(share) for share in self.tp_shares]
        body["state"] = self.state.value
        body["addrs"] = list(self.addrs)
        body["relays"] = list(self.relays)
        body["devices"] = [asdict(d) for d in self.devices]
        body["links"] = [[bytes.fromhex(tag), round(ms * 10)] for tag, ms in self.links]
        body["tp_choices"] = list(self.tp_choices)
        body["tp_speeds"] = [list(entry) for entry in self.tp_speeds]
        return msgpack.packb(body, use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> PeerRecord:
        """Parses a record; raises ValueError if it is malformed or of a newer schema."""
        body = unpack_map(data)
        if body.get("schema") != RECORD_SCHEMA_VERSION:
            raise ValueError(f"record schema {body.get('schema')!r} is not {RECORD_SCHEMA_VERSION}")
        known = {f.name: body[f.name] for f in fields(cls) if f.name in body}  # unknown fields ignored
        try:
            known["state"] = PeerState(known["state"])
            known["addrs"] = tuple(str(a) for a in known.get("addrs", ()))
            known["relays"] = tuple(str(a) for a in known.get("relays", ()))
            known["devices"] = tuple(DeviceInfo.from_dict(d) for d in known.get("devices", ()))
            known["links"] = parse_links(known.get("links", ()))
            known["tp_choices"] = parse_tp_choices(known.get("tp_choices", ()))
            known["tp_speeds"] = parse_tp_speeds(known.get("tp_speeds", ()))
            known["tp_shares"] = parse_tp_shares(known.get("tp_shares", ()))
            record = cls(**known)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed peer record: {e}") from None
        _check_ranges(record)
        return record


@dataclass(frozen=True)
class ModelEntry:
    """A peer's note that it serves `model_id`, so `hexswarm status` can list models."""

    model_id: str
    num_blocks: int
    schema: int = RECORD_SCHEMA_VERSION

    def to_bytes(self) -> bytes:
        return msgpack.packb(
            {"model_id": self.model_id, "num_blocks": self.num_blocks, "schema": self.schema}
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ModelEntry:
        body = unpack_map(data)
        model_id, num_blocks = body.get("model_id"), body.get("num_blocks")
        # Readers size per-block tables by num_blocks (`hexswarm status`, the monitor).
        if not isinstance(model_id, str) or len(model_id) > MAX_TEXT:
            raise ValueError(f"a model entry's model_id must be text of at most {MAX_TEXT} characters")
        if not is_int(num_blocks) or not 1 <= num_blocks <= MAX_BLOCKS:
            raise ValueError(f"a model entry's num_blocks must be in [1, {MAX_BLOCKS}]")
        return cls(model_id=model_id, num_blocks=num_blocks)


def read_peer_records(
    dht, model_id: str, timeout: float | None = None, shards: list[int] | None = None
) -> list[PeerRecord]:
    """Every well-formed, correctly signed record of `model_id` currently in the DHT (of the
    peers in `shards` only, if given); none (logged) if the DHT does not answer within `timeout`
    seconds (swarm.net.dht_read.DHT_READ_TIMEOUT_S). Only the nodes nearest each key are asked:
    every peer stores its record on them each announce period (swarm/net/dht_read.py)."""
    from hexswarm.swarm.net.dht_read import get_many_latest

    return peer_records_from(get_many_latest(dht, record_keys(model_id, shards), timeout), model_id)


async def records_values(dht, model_id: str, timeout: float = 10.0, shards: list[int] | None = None) -> dict:
    """{key: DHT value or None} of every shard of `model_id`'s records (or of `shards`), read on
    an event loop; {} if the read failed (swarm/net/dht_read.py `get_many_latest`)."""
    from hexswarm.swarm.net.dht_read import dht_get_many

    return await dht_get_many(dht, record_keys(model_id, shards), timeout)


async def fetch_peer_records(
    dht, model_id: str, timeout: float = 10.0, shards: list[int] | None = None
) -> list[PeerRecord]:
    """`read_peer_records` for code on an event loop (a peer, the coordinator)."""
    return peer_records_from(await records_values(dht, model_id, timeout, shards), model_id)


async def shard_records(dht, model_id: str, peer_id: str, timeout: float = 10.0) -> list[PeerRecord]:
    """The records of `model_id` in `peer_id`'s shard (one key): whether it announces the model."""
    return await fetch_peer_records(dht, model_id, timeout, [record_shard(peer_id)])


def peer_records_from(values: dict, model_id: str, keep_gone: bool = False) -> list[PeerRecord]:
    """The well-formed, correctly signed records in {record key: DHT value} of `model_id`,
    each from the shard of its signer (record_keys.py says why), those of GONE peers dropped
    unless `keep_gone` (a reader that must tell "said it left" from "not found this time")."""
    records = []
    for key, value in values.items():
        for owner, record in parse_signed_entries(value, PeerRecord.from_bytes):
            if record.peer_id != owner:
                warn_once(
                    owner, f"ignoring a record that claims peer {record.peer_id!r} but is signed by {owner}"
                )
            elif record.model_id != model_id or record_key(model_id, owner) != key:
                warn_once(
                    owner, f"ignoring a record of ...{owner[-8:]} stored under another key than its own"
                )
            elif keep_gone or record.state != PeerState.GONE:
                records.append(record)
    return records


def read_models(dht, timeout: float | None = None) -> dict[str, int]:
    """model_id -> number of blocks, for every model some peer announced; none (logged) if the
    DHT does not answer within `timeout` seconds (swarm.net.dht_read.DHT_READ_TIMEOUT_S)."""
    from hexswarm.swarm.net.dht_read import get_many_latest

    values = get_many_latest(dht, index_keys(), timeout)  # re-stored each period
    return models_from(
        [
            (owner, entry)
            for key, value in values.items()
            for owner, entry in parse_signed_entries(value, ModelEntry.from_bytes)
            if key == index_key(owner)  # its own key, as for records
        ]
    )


def models_from(entries: list[tuple[str, ModelEntry]]) -> dict[str, int]:
    """model_id -> the number of blocks most of its signers announce (ties: the fewest), so one
    peer announcing a count of its own for another model's id does not change it for readers."""
    votes: dict[str, Counter[int]] = {}
    for _, entry in entries:
        votes.setdefault(entry.model_id, Counter())[entry.num_blocks] += 1
    return {
        model_id: min(counts, key=lambda blocks: (-counts[blocks], blocks))
        for model_id, counts in votes.items()
    }


def block_ranges(blocks: list[int]) -> str:
    """[1, 2, 3, 7] -> '1:4, 7:8' (half-open ranges, as --layers takes them)."""
    out, start = [], None
    for i, b in enumerate(blocks):
        start = b if start is None else start
        if i + 1 == len(blocks) or blocks[i + 1] != b + 1:
            out.append(f"{start}:{b + 1}")
            start = None
    return ", ".join(out)


def online_peers_per_block(records: list[PeerRecord], num_blocks: int) -> list[int]:
    """How many online peers serve each block of a model (0 means the block is missing)."""
    counts = [0] * num_blocks
    for r in records:
        if r.state == PeerState.ONLINE:
            for block in range(r.start, min(r.end, num_blocks)):
                counts[block] += 1
    return counts


def _check_ranges(record: PeerRecord) -> None:
    """Every field of a parsed record has its type and lies in its range (ValueError if not)."""
    for name in TEXT_FIELDS:
        check_text(name, getattr(record, name))
    for name, (low, high) in INT_RANGES.items():
        value = getattr(record, name)
        if not is_int(value) or not low <= value <= high:
            raise ValueError(f"field {name} must be an integer in [{low}, {high}], got {value!r}")
    for name, (low, high) in FLOAT_RANGES.items():
        value = getattr(record, name)
        if not is_number(value) or not low <= value < high:
            raise ValueError(f"field {name} must be a finite number in [{low}, {high}), got {value!r}")
    if not isinstance(record.auto, bool):
        raise ValueError("field auto must be a boolean")
    if record.quant not in QUANT_FORMATS:
        raise ValueError(f"unknown weight format {str(record.quant)[:32]!r}")
    if record.role not in ROLES:
        raise ValueError(f"unknown role {str(record.role)[:32]!r}")
    if not record.start < record.end:
        raise ValueError(f"bad layer range {record.start}:{record.end}")
    if record.state == PeerState.ONLINE and not record.throughput > 0:
        raise ValueError("an online peer must announce a throughput > 0")
    if (record.next_start, record.next_end) != (0, 0) and not record.next_start < record.next_end:
        raise ValueError(f"bad next layer range {record.next_start}:{record.next_end}")
    if len(record.addrs) > MAX_ADDRS or any(len(a) > MAX_TEXT for a in record.addrs):
        raise ValueError(f"at most {MAX_ADDRS} addresses of at most {MAX_TEXT} characters")
    if record.reachability not in REACHABILITY:
        raise ValueError(f"unknown reachability {str(record.reachability)[:32]!r}")
    if len(record.relays) > MAX_ADDRS or any(len(r) > MAX_TEXT for r in record.relays):
        raise ValueError(f"at most {MAX_ADDRS} relays of at most {MAX_TEXT} characters")
    if record.observed_group and not _is_network(record.observed_group):
        raise ValueError(f"observed_group {str(record.observed_group)[:64]!r} is not an IP network")
    if record.devices and len(record.devices) != record.tp:
        raise ValueError(f"tp {record.tp} does not match its {len(record.devices)} devices")
    if record.tp_choices and record.tp not in record.tp_choices:
        raise ValueError(f"tp {record.tp} is not one of its tp_choices {record.tp_choices}")
    if record.tp_partition not in TP_PARTITIONS:
        raise ValueError(f"unknown tensor-parallel partition {str(record.tp_partition)[:32]!r}")
    if record.tp_shares and len(record.tp_shares) != record.tp:
        raise ValueError(f"tp {record.tp} does not match its {len(record.tp_shares)} tp_shares")


def _is_network(text) -> bool:
    """Whether `text` is an IP network in a short text form ("203.0.113.0/24")."""
    if not isinstance(text, str) or len(text) > 64:
        return False
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True
