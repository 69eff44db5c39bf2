"""What peers announce in the DHT, and how anyone reads it back.

Layout (one DHT key per model; each peer owns one subkey, protected by its signature):

    hexswarm/v1/models/<model_id>   subkey [owner:<peer's public key>]  ->  msgpack PeerRecord
    hexswarm/v1/models              subkey [owner:<peer's public key>]  ->  msgpack ModelEntry

Values carry a schema version; readers skip records they cannot parse, records whose peer id
is not the one of the key that signed them, and fields they do not know. A new field with a
default (like `tp`, `devices` and `decode_batch_tokens_per_s`) keeps the schema version, so older readers still read newer
records and newer readers fill in the default for older ones; the version changes only when
a field changes meaning or goes away.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import msgpack

from hexswarm.routing.scheduler.weight_formats import DEFAULT_QUANT, QUANT_FORMATS

logger = logging.getLogger(__name__)

RECORD_SCHEMA_VERSION = 1
ROLES = ("both", "prefill", "decode")  # what a peer serves of a request (PeerRecord.role)
MODELS_KEY = "hexswarm/v1/models"


def model_key(model_id: str) -> str:
    return f"{MODELS_KEY}/{model_id}"


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
    rtt_ms: tuple[tuple[str, float], ...] = ()  # (peer id, smoothed round trip in ms) to a sample of peers
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
    # How a tensor-parallel group splits each layer (Hepti, peer/tp_partition.py): "even" (1/tp
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
    schema: int = RECORD_SCHEMA_VERSION

    def to_bytes(self) -> bytes:
        body = asdict(self)
        body["tp_shares"] = [list(share) for share in self.tp_shares]
        body["state"] = self.state.value
        body["addrs"] = list(self.addrs)
        body["relays"] = list(self.relays)
        body["devices"] = [asdict(d) for d in self.devices]
        body["rtt_ms"] = [[peer, ms] for peer, ms in self.rtt_ms]
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
            known["rtt_ms"] = _parse_rtts(known.get("rtt_ms", ()))
            known["tp_choices"] = _parse_tp_choices(known.get("tp_choices", ()))
            known["tp_speeds"] = _parse_tp_speeds(known.get("tp_speeds", ()))
            known["tp_shares"] = _parse_tp_shares(known.get("tp_shares", ()))
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
        if not _is_int(num_blocks) or not 1 <= num_blocks <= MAX_BLOCKS:
            raise ValueError(f"a model entry's num_blocks must be in [1, {MAX_BLOCKS}]")
        return cls(model_id=model_id, num_blocks=num_blocks)


def parse_signed_entries(
    dict_value: Any, parse, owner_marker: Callable[[bytes], bytes] = lambda subkey: subkey
):
    """Turns a hivemind dictionary value {subkey: ValueWithExpiration} into [(peer_id, parsed)],
    keeping only entries that parse and whose subkey is an owner marker (or, with `owner_marker`,
    holds one that it extracts: subkeys that also name what the entry is about)."""
    # here, not at the top: an edge peer (peer/edge/) builds records in a process without hivemind
    from hexswarm.swarm.identity import peer_id_from_owner_marker

    entries = []
    if not isinstance(getattr(dict_value, "value", None), dict):
        return entries
    for subkey, item in dict_value.value.items():
        try:
            marker = owner_marker(subkey if isinstance(subkey, bytes) else str(subkey).encode())
            owner = peer_id_from_owner_marker(marker).to_base58()
        except Exception as e:  # anything malformed from the network is skipped, never raised
            logger.debug("skipping a DHT entry with a bad subkey: %s", e)
            continue
        try:
            entries.append((owner, parse(item.value)))
        except Exception as e:
            warn_once(owner, f"ignoring an entry signed by ...{owner[-8:]}: {e}")
    return entries


_warned: dict[tuple[str, str], None] = {}  # (peer id, reason) already logged, oldest first
_warned_lock = threading.Lock()  # a client reads records from several threads (the API's)
MAX_WARNED = 4096


def warn_once(peer_id: str, message: str) -> None:
    """Logs a bad entry once per peer and reason: a record is re-read every few seconds, and
    a hostile peer must not be able to flood its readers' logs."""
    key = (peer_id, message)
    with _warned_lock:
        if key in _warned:
            return
        if len(_warned) >= MAX_WARNED:
            del _warned[next(iter(_warned))]
        _warned[key] = None
    logger.warning(message)


def read_peer_records(dht, model_id: str, timeout: float | None = None) -> list[PeerRecord]:
    """Every well-formed, correctly signed record of `model_id` currently in the DHT; none (logged)
    if the DHT does not answer within `timeout` seconds (swarm.dht_read.DHT_READ_TIMEOUT_S)."""
    from hexswarm.swarm.dht_read import get_latest

    return peer_records_from(get_latest(dht, model_key(model_id), timeout), model_id)


def peer_records_from(value, model_id: str) -> list[PeerRecord]:
    """The well-formed, correctly signed records in a DHT value of `model_key(model_id)`."""
    records = []
    for owner, record in parse_signed_entries(value, PeerRecord.from_bytes):
        if record.peer_id != owner:
            warn_once(
                owner, f"ignoring a record that claims peer {record.peer_id!r} but is signed by {owner}"
            )
            continue
        if record.model_id != model_id:
            warn_once(owner, f"ignoring a record of ...{owner[-8:]} stored under another model's key")
            continue
        if record.state != PeerState.GONE:
            records.append(record)
    return records


def read_models(dht, timeout: float | None = None) -> dict[str, int]:
    """model_id -> number of blocks, for every model some peer announced; none (logged) if the
    DHT does not answer within `timeout` seconds (swarm.dht_read.DHT_READ_TIMEOUT_S)."""
    from hexswarm.swarm.dht_read import get_latest

    value = get_latest(dht, MODELS_KEY, timeout)
    return models_from(parse_signed_entries(value, ModelEntry.from_bytes))


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


def _parse_rtts(raw: Any) -> tuple[tuple[str, float], ...]:
    if not isinstance(raw, list | tuple) or len(raw) > 256:
        raise ValueError("rtt_ms must be a list of at most 256 [peer id, ms] pairs")
    pairs = []
    for item in raw:
        if (
            not isinstance(item, list | tuple)
            or len(item) != 2
            or not isinstance(item[0], str)
            or len(item[0]) > MAX_TEXT
            or isinstance(item[1], bool)
            or not isinstance(item[1], int | float)
            or not 0 <= item[1] < 1e6
        ):
            raise ValueError("an rtt_ms entry is not a [peer id, ms] pair")
        pairs.append((item[0], float(item[1])))
    return tuple(pairs)


MAX_TP_DEGREE = 64
# "even", or one of Hepti's modes (routing/hepti/split.py MODES; a test keeps the two in step,
# and reading records need not load scipy)
TP_PARTITIONS = ("even", "weight-stationary", "1d-tiled", "2d-tiled")


def _parse_tp_choices(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list | tuple) or len(raw) > MAX_TP_DEGREE:
        raise ValueError(f"tp_choices must be a list of at most {MAX_TP_DEGREE} degrees")
    if not all(_is_degree(k) for k in raw):
        raise ValueError(f"a tp choice is not a degree in 1..{MAX_TP_DEGREE}")
    if list(raw) != sorted(set(raw)):
        raise ValueError("tp_choices must be sorted and distinct")
    return tuple(raw)


def _parse_tp_speeds(raw: Any) -> tuple[tuple[int, float, float], ...]:
    if not isinstance(raw, list | tuple) or len(raw) > MAX_TP_DEGREE:
        raise ValueError(f"tp_speeds must be a list of at most {MAX_TP_DEGREE} entries")
    entries = []
    for item in raw:
        if not isinstance(item, list | tuple) or len(item) != 3:
            raise ValueError("a tp_speeds entry is not [degree, tokens/s, ms]")
        degree, tokens_per_s, decode_ms = item
        if not _is_degree(degree):
            raise ValueError(f"a tp_speeds degree is not in 1..{MAX_TP_DEGREE}")
        if not all(_positive(x) for x in (tokens_per_s, decode_ms)):
            raise ValueError("tp_speeds figures must be positive numbers")
        entries.append((degree, float(tokens_per_s), float(decode_ms)))
    if [e[0] for e in entries] != sorted({e[0] for e in entries}):
        raise ValueError("tp_speeds must be sorted by degree, one entry each")
    return tuple(entries)


def _parse_tp_shares(raw: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(raw, list | tuple) or len(raw) > MAX_TP_DEGREE:
        raise ValueError(f"tp_shares must be a list of at most {MAX_TP_DEGREE} entries")
    shares = []
    for item in raw:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise ValueError("a tp_shares entry is not [heads, MLP columns]")
        if not all(_is_int(x) and 1 <= x <= MAX_COUNT for x in item):
            raise ValueError("tp_shares counts must be positive integers")
        shares.append((item[0], item[1]))
    return tuple(shares)


def _is_degree(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, int) and 1 <= x <= MAX_TP_DEGREE


def _positive(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, int | float) and 0 < x < 1e12


def unpack_map(data: Any, max_bytes: int = 64 * 1024) -> dict:
    """A DHT value (remote input) as a msgpack map; ValueError if it is not one or is too long."""
    if not isinstance(data, bytes | bytearray) or len(data) > max_bytes:
        raise ValueError(f"record must be at most {max_bytes // 1024} KiB of bytes")
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception:
        raise ValueError("record is not msgpack") from None
    if not isinstance(body, dict):
        raise ValueError("record is not a map")
    return body


# Bounds on what a record may say. They do not make a peer honest (a signed record can still
# lie within them); they keep one broken or hostile record from breaking its readers: a NaN or
# zero throughput, a negative session count or a billion-block range would otherwise reach the
# routers' arithmetic, or a terminal, as it is.
MAX_BLOCKS = 100_000
MAX_TEXT = 256  # names, versions, devices, regions, model ids
MAX_ADDRS = 32
MAX_COUNT = 1 << 40  # cache tokens, device bytes
MAX_SPEED = 1e12  # tokens/s
MAX_MS = 1e7  # ms per block
MAX_SESSIONS = 1_000_000
MAX_LENGTH = 1 << 24  # tokens
MAX_BATCH = 4096
MAX_PLAN_VERSION = 1 << 53  # as far as a float counts exactly; plans bound it much tighter

REACHABILITY = ("", "direct", "relayed", "unreachable")
_TEXT_FIELDS = ("peer_id", "name", "model_id", "dtype", "device", "version", "region")
_INT_RANGES = {
    "start": (0, MAX_BLOCKS - 1),
    "end": (1, MAX_BLOCKS),
    "cache_tokens_left": (0, MAX_COUNT),
    "open_sessions": (0, MAX_SESSIONS),
    "max_length": (1, MAX_LENGTH),
    "tp": (1, MAX_TP_DEGREE),
    "max_blocks": (0, MAX_BLOCKS),
    "plan_version": (0, MAX_PLAN_VERSION),
    "next_start": (0, MAX_BLOCKS),
    "next_end": (0, MAX_BLOCKS),
    "decode_batch_size": (1, MAX_BATCH),
    "weight_bytes_per_block": (0, MAX_COUNT),
    "tp_repartitions": (0, MAX_COUNT),
}
_FLOAT_RANGES = {  # [low, high)
    "throughput": (0.0, MAX_SPEED),  # 0 until measured; an online peer has measured (below)
    "decode_ms_per_block": (0.0, MAX_MS),
    "decode_batch_tokens_per_s": (0.0, MAX_SPEED),
    "tp_predicted_step_ms": (0.0, MAX_MS),
    "tp_observed_step_ms": (0.0, MAX_MS),
}


def _check_ranges(record: PeerRecord) -> None:
    """Every field of a parsed record has its type and lies in its range (ValueError if not)."""
    for name in _TEXT_FIELDS:
        _check_text(name, getattr(record, name))
    for name, (low, high) in _INT_RANGES.items():
        value = getattr(record, name)
        if not _is_int(value) or not low <= value <= high:
            raise ValueError(f"field {name} must be an integer in [{low}, {high}], got {value!r}")
    for name, (low, high) in _FLOAT_RANGES.items():
        value = getattr(record, name)
        if not _is_number(value) or not low <= value < high:
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
    if record.devices and len(record.devices) != record.tp:
        raise ValueError(f"tp {record.tp} does not match its {len(record.devices)} devices")
    if record.tp_choices and record.tp not in record.tp_choices:
        raise ValueError(f"tp {record.tp} is not one of its tp_choices {record.tp_choices}")
    if record.tp_partition not in TP_PARTITIONS:
        raise ValueError(f"unknown tensor-parallel partition {str(record.tp_partition)[:32]!r}")
    if record.tp_shares and len(record.tp_shares) != record.tp:
        raise ValueError(f"tp {record.tp} does not match its {len(record.tp_shares)} tp_shares")


def _check_text(name: str, value: Any) -> None:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"field {name} must be text of at most {MAX_TEXT} characters")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    # NaN fails every comparison, infinities fail the upper bounds.
    return isinstance(x, int | float) and not isinstance(x, bool)
