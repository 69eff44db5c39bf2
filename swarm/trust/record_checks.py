"""Bounds on what a record in the DHT may say, and the checks that parse its fields to them.

Every reader (clients, routers, the coordinator, status, the monitor) reads every peer's signed
record, so a record is remote input: these checks run once, when it is parsed
(swarm/trust/records.py `PeerRecord.from_bytes`), and a record that fails is dropped alone. They do
not make a peer honest (a signed record can still lie within them); they keep one broken or
hostile record from breaking its readers: a NaN or zero throughput, a negative session count or
a billion-block range would otherwise reach the routers' arithmetic, or a terminal, as it is.

Here: the bounds and the tables of which field has which, the parsers of the fields that are
lists (round trips, tensor-parallel degrees, speeds and shares), and `unpack_map`, which every
value read from the DHT or a dial-back goes through first.
"""

from __future__ import annotations

from typing import Any

import msgpack

MAX_BLOCKS = 100_000
MAX_TEXT = 256  # names, versions, devices, regions, model ids
MAX_LINKS = 256  # round trips a record may carry (peers publish at most 32: peer/link_probe.py)
LINK_TAG_BYTES = 8  # a link names its other end by the first 8 bytes of a hash of its peer id
MAX_LINK_TENTHS = 10_000_000  # a round trip of 1,000 s, in tenths of a ms
MAX_ADDRS = 32
MAX_COUNT = 1 << 40  # cache tokens, device bytes
MAX_SPEED = 1e12  # tokens/s
MAX_MS = 1e7  # ms per block
MAX_SESSIONS = 1_000_000
MAX_LENGTH = 1 << 24  # tokens
MAX_BATCH = 4096
MAX_PLAN_VERSION = 1 << 53  # as far as a float counts exactly; plans bound it much tighter
MAX_TP_DEGREE = 64
MAX_RELAY_SLOTS = 1 << 16

REACHABILITY = ("", "direct", "relayed", "unreachable")
# "even", or one of Hepti's modes (routing/hepti/split.py MODES; a test keeps the two in step,
# and reading records need not load scipy)
TP_PARTITIONS = ("even", "weight-stationary", "1d-tiled", "2d-tiled")

TEXT_FIELDS = ("peer_id", "name", "model_id", "dtype", "device", "version", "region")
INT_RANGES = {  # field -> [low, high]
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
    "relay_slots_free": (-1, MAX_RELAY_SLOTS),
}
FLOAT_RANGES = {  # field -> [low, high)
    "throughput": (0.0, MAX_SPEED),  # 0 until measured; an online peer has measured (records.py)
    "decode_ms_per_block": (0.0, MAX_MS),
    "decode_batch_tokens_per_s": (0.0, MAX_SPEED),
    "tp_predicted_step_ms": (0.0, MAX_MS),
    "tp_observed_step_ms": (0.0, MAX_MS),
}


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


def parse_links(raw: Any) -> tuple[tuple[str, float], ...]:
    """`links` on the wire: at most MAX_LINKS [link tag (LINK_TAG_BYTES bytes), round trip in
    tenths of a ms] pairs, read as (tag in hex, ms) (swarm/trust/records.py `link_tag`)."""
    if not isinstance(raw, list | tuple) or len(raw) > MAX_LINKS:
        raise ValueError(f"links must be a list of at most {MAX_LINKS} [tag, tenths of a ms] pairs")
    pairs = []
    for item in raw:
        if (
            not isinstance(item, list | tuple)
            or len(item) != 2
            or not isinstance(item[0], bytes)
            or len(item[0]) != LINK_TAG_BYTES
            or not is_int(item[1])
            or not 0 <= item[1] <= MAX_LINK_TENTHS
        ):
            raise ValueError("a links entry is not a [tag, tenths of a ms] pair")
        pairs.append((item[0].hex(), item[1] / 10))
    return tuple(pairs)


def parse_tp_choices(raw: Any) -> tuple[int, ...]:
    """`tp_choices`: distinct degrees in 1..MAX_TP_DEGREE, sorted."""
    if not isinstance(raw, list | tuple) or len(raw) > MAX_TP_DEGREE:
        raise ValueError(f"tp_choices must be a list of at most {MAX_TP_DEGREE} degrees")
    if not all(_is_degree(k) for k in raw):
        raise ValueError(f"a tp choice is not a degree in 1..{MAX_TP_DEGREE}")
    if list(raw) != sorted(set(raw)):
        raise ValueError("tp_choices must be sorted and distinct")
    return tuple(raw)


def parse_tp_speeds(raw: Any) -> tuple[tuple[int, float, float], ...]:
    """`tp_speeds`: (degree, tokens/s, ms) entries, one a degree, sorted by degree."""
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


def parse_tp_shares(raw: Any) -> tuple[tuple[int, int], ...]:
    """`tp_shares`: (heads, MLP columns) of each rank, positive counts."""
    if not isinstance(raw, list | tuple) or len(raw) > MAX_TP_DEGREE:
        raise ValueError(f"tp_shares must be a list of at most {MAX_TP_DEGREE} entries")
    shares = []
    for item in raw:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise ValueError("a tp_shares entry is not [heads, MLP columns]")
        if not all(is_int(x) and 1 <= x <= MAX_COUNT for x in item):
            raise ValueError("tp_shares counts must be positive integers")
        shares.append((item[0], item[1]))
    return tuple(shares)


def check_text(name: str, value: Any) -> None:
    """ValueError unless field `name` is text of at most MAX_TEXT characters."""
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"field {name} must be text of at most {MAX_TEXT} characters")


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    # NaN fails every comparison, infinities fail the upper bounds.
    return isinstance(x, int | float) and not isinstance(x, bool)


def _is_degree(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, int) and 1 <= x <= MAX_TP_DEGREE


def _positive(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, int | float) and 0 < x < 1e12
