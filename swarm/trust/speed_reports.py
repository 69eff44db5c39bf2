"""Decode speeds that clients observed, shared so that the coordinator, `status` and the monitor
judge peers by what was measured, not by what they announce (client/observed.py measures them).

Layout (one DHT key per model; one entry per reporter, under a subkey its key signs):

    hexswarm/v1/observed/<model_id>   subkey [owner:<reporter's public key>]
                                      ->  msgpack {"schema": 1, "peers": {peer id: [ms, samples]}}

`ms` is the reporter's median decode ms per block of that peer over its last `samples` steps.

Reading (`read`): a reader looks at the MAX_ENTRIES newest entries (by expiration; one that
claims to live longer than TTL_S is ignored), at most MAX_ENTRIES_PER_GROUP of one reporter IP
group, and ignores entries over MAX_ENTRY_BYTES: the key's size is whatever strangers store, its
cost to a reader is not.

Groups (`groups`: reporter id -> IP group, /24 or /48) come only from what a reporter proves to
the reader: the address of a live connection the reader holds with the reporter's own key
(`connected_groups`). A key's word about its home proves nothing, so every reporter the reader
cannot place shares ONE vote, whatever the number of its keys.

Combining (`combine`): per peer, each group's vote is the median of its reporters' figures, and
the peer's observed figure is the median over the votes; it counts only once MIN_REPORTERS
distinct reporters saw the peer. A figure is only ever used to slow a peer down, never to speed
it up, and only when its announcement is more than TRUST_FACTOR times faster (client timing
includes overheads that the announced compute does not). So a boaster cannot buy speed with
reports of its own. Planning (`planned_ms`) bounds the effect: reports move a peer's planned
speed by at most x(1/MAX_UNPROVEN_SLOWDOWN) = x0.5, unless MIN_GROUPS proven groups agree, whose
median then counts in full. So keys at no cost (any number of them, from one home) can halve an
honest peer's planned speed at most, and the peers' reports on themselves count for nothing.

What this does not stop: a reporter no reader can place (a client that dials out only) is one
unproven vote; three or more machines in three IP groups can still plan an honest peer at its
reported speed. `status` lists the peer as flagged, with the number of reporters and groups,
and each client still routes by its own observations.
"""

from __future__ import annotations

import ipaddress
import logging
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgpack
from hivemind.utils import get_dht_time

from hexswarm.swarm.net.dht_read import get_latest
from hexswarm.swarm.net.maddrs import ip_group, tcp_addr
from hexswarm.swarm.trust.records import PeerRecord, parse_signed_entries, unpack_map

logger = logging.getLogger(__name__)

SCHEMA = 1
OBSERVED_KEY = "hexswarm/v1/observed"
TTL_S = 600.0  # a reporter's entry lives this long unless refreshed
PUBLISH_EVERY_S = 30.0  # how often a client refreshes its entry (only when it has figures)
MIN_REPORTERS = 3  # distinct reporters before an observed figure counts
TRUST_FACTOR = 2.0  # an announcement up to this many times faster than observed is believed
MAX_PEERS = 256  # peers per entry (a longer entry is refused)
MAX_MS_PER_BLOCK = 60_000.0
MAX_ENTRY_BYTES = 24 * 1024  # MAX_PEERS figures (a peer id and two numbers each) fit in ~17 KiB
MAX_ENTRIES = 64  # entries a reader parses, newest first: the key is written by strangers
MAX_ENTRIES_PER_GROUP = 8  # of one reporter IP group (all unproven reporters are one group)
EXPIRY_SLACK_S = 60.0  # an entry may expire this much later than TTL_S from now (clock skew)
MIN_GROUPS = 3  # proven reporter groups that must agree before reports count in full
MAX_UNPROVEN_SLOWDOWN = 2.0  # otherwise a peer's planned decode time grows at most this much
UNPROVEN = ""  # the one group of every reporter the reader cannot place


def observed_key(model_id: str) -> str:
    return f"{OBSERVED_KEY}/{model_id}"


def encode(speeds: Mapping[str, tuple[float, int]]) -> bytes:
    """A reporter's entry: peer id -> (median ms per block, samples)."""
    peers = {p: [float(ms), int(n)] for p, (ms, n) in list(speeds.items())[:MAX_PEERS]}
    return msgpack.packb({"schema": SCHEMA, "peers": peers}, use_bin_type=True)


def decode(data: Any) -> dict[str, tuple[float, int]]:
    """One entry (remote input); ValueError if it is malformed or out of range."""
    body = unpack_map(data, max_bytes=MAX_ENTRY_BYTES)
    if body.get("schema") != SCHEMA or not isinstance(body.get("peers"), dict):
        raise ValueError("observed speeds are not of the known schema")
    if len(body["peers"]) > MAX_PEERS:
        raise ValueError(f"observed speeds name over {MAX_PEERS} peers")
    speeds = {}
    for peer_id, figure in body["peers"].items():
        if not (isinstance(peer_id, str) and isinstance(figure, list) and len(figure) == 2):
            raise ValueError("an observed speed is not [ms, samples]")
        ms, samples = figure
        if not isinstance(ms, float | int) or not 0.0 <= ms <= MAX_MS_PER_BLOCK:
            raise ValueError("an observed ms per block is out of range")
        if not isinstance(samples, int) or samples < 1:
            raise ValueError("an observed speed has no samples")
        speeds[peer_id] = (float(ms), samples)
    return speeds


def publish(dht, owner_marker: bytes, model_id: str, speeds: Mapping[str, tuple[float, int]], now: float):
    """Stores this reporter's entry, signed by the key of `owner_marker`; hivemind's future."""
    return dht.store(
        observed_key(model_id), encode(speeds), now + TTL_S, subkey=owner_marker, return_future=True
    )


def read(
    dht, model_id: str, timeout: float | None = None, groups: Mapping[str, str] | None = None
) -> dict[str, dict[str, tuple[float, int]]]:
    """reporter id -> its entry, for the newest well-formed signed entries of `model_id`: at most
    MAX_ENTRIES, MAX_ENTRIES_PER_GROUP of one group of `groups` (reporters it does not name are
    one group)."""
    value = get_latest(dht, observed_key(model_id), timeout)
    if not isinstance(getattr(value, "value", None), dict):
        return {}
    kept = newest(value.value, groups or {}, get_dht_time())
    return dict(parse_signed_entries(_Entries(kept), decode))


class _Entries:
    """The shape of hivemind's dictionary value that parse_signed_entries reads."""

    def __init__(self, value: dict):
        self.value = value


def newest(items: Mapping[Any, Any], groups: Mapping[str, str], now: float) -> dict:
    """The entries of a DHT dictionary {subkey: ValueWithExpiration} a reader looks at: newest
    expiration first, none that expires over TTL_S (and a slack) from `now` or is over
    MAX_ENTRY_BYTES, at most MAX_ENTRIES_PER_GROUP per reporter group and MAX_ENTRIES in all."""
    from hexswarm.swarm.net.identity import peer_id_from_owner_marker  # here: hivemind's crypto

    latest = now + TTL_S + EXPIRY_SLACK_S
    fresh = [
        (subkey, item)
        for subkey, item in items.items()
        if isinstance(getattr(item, "expiration_time", None), float | int)
        and item.expiration_time <= latest
        and isinstance(item.value, bytes)
        and len(item.value) <= MAX_ENTRY_BYTES
    ]
    fresh.sort(key=lambda pair: pair[1].expiration_time, reverse=True)
    kept: dict = {}
    per_group: dict[str, int] = defaultdict(int)
    for subkey, item in fresh[: MAX_ENTRIES * 4]:  # the owner costs a key parse: bound that too
        try:
            marker = subkey if isinstance(subkey, bytes) else str(subkey).encode()
            group = groups.get(peer_id_from_owner_marker(marker).to_base58(), UNPROVEN)
        except Exception:
            continue  # parse_signed_entries would skip it too
        if per_group[group] < MAX_ENTRIES_PER_GROUP:
            per_group[group] += 1
            kept[subkey] = item
            if len(kept) >= MAX_ENTRIES:
                break
    return kept


async def connected_groups(p2p) -> dict[str, str]:
    """peer id -> the IP group of the connection `p2p` holds with it: what a reporter proves to
    this reader (a reporter signs its entry with its own libp2p key). Loopback and addresses
    that are not TCP place nobody (a swarm on one machine is one operator's)."""
    groups = {}
    for info in await p2p.list_peers():
        for maddr in info.addrs:
            addr = tcp_addr(str(maddr))
            if addr is not None and not ipaddress.ip_address(addr.ip).is_loopback:
                groups[info.peer_id.to_base58()] = ip_group(addr.ip)
                break
    return groups


@dataclass(frozen=True)
class Observed:
    """What clients observed of one peer, combined."""

    ms_per_block: float  # the median over the groups' votes
    reporters: int  # distinct reporter keys
    proven: tuple[float, ...] = ()  # the proven reporter groups' votes, ascending

    @property
    def groups(self) -> int:
        """Distinct proven reporter groups."""
        return len(self.proven)


def combine(
    entries: Mapping[str, Mapping[str, tuple[float, int]]], groups: Mapping[str, str] | None = None
) -> dict[str, Observed]:
    """peer id -> its combined figure, for peers seen by MIN_REPORTERS reporters or more; each
    group of `groups` votes once (the median of its reporters), and every reporter `groups`
    does not name is in one group."""
    groups = groups or {}
    seen: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for reporter, speeds in entries.items():
        for peer_id, (ms, _) in speeds.items():
            if peer_id != reporter:  # a peer's report on itself is no observation
                seen[peer_id][groups.get(reporter, UNPROVEN)].append(ms)
    out = {}
    for peer_id, by_group in seen.items():
        reporters = sum(len(figures) for figures in by_group.values())
        if reporters < MIN_REPORTERS:
            continue
        votes = {group: statistics.median(figures) for group, figures in by_group.items()}
        proven = tuple(sorted(ms for group, ms in votes.items() if group != UNPROVEN))
        out[peer_id] = Observed(statistics.median(votes.values()), reporters, proven)
    return out


def over_announced(record: PeerRecord, observed: Mapping[str, Observed]) -> Observed | None:
    """What clients observed of `record`'s peer, if it announces itself over TRUST_FACTOR faster."""
    figure = observed.get(record.peer_id)
    if figure is None or figure.ms_per_block <= TRUST_FACTOR * record.decode_ms_per_block:
        return None
    return figure


def planned_ms(announced_ms: float, figure: Observed) -> float:
    """The decode time to plan an over-announcer at: the median of the proven groups' votes in
    full when MIN_GROUPS of them find it over TRUST_FACTOR slower than announced and their median
    does too; otherwise the observed figure, but at most MAX_UNPROVEN_SLOWDOWN times the announced."""
    slower = TRUST_FACTOR * announced_ms
    agreeing = sum(ms > slower for ms in figure.proven)
    if agreeing >= MIN_GROUPS and statistics.median(figure.proven) > slower:
        return statistics.median(figure.proven)
    return min(figure.ms_per_block, MAX_UNPROVEN_SLOWDOWN * announced_ms)


def as_observed(records: Sequence[PeerRecord], observed: Mapping[str, Observed]) -> list[PeerRecord]:
    """`records` with each over-announcing peer's speeds slowed to what clients observed, within
    `planned_ms`'s bound: its decode time set to that, its throughputs (and per-degree figures)
    scaled alike."""
    out = []
    for record in records:
        figure = over_announced(record, observed)
        if figure is None:
            out.append(record)
            continue
        ms = planned_ms(record.decode_ms_per_block, figure)
        scale = record.decode_ms_per_block / ms
        out.append(
            replace(
                record,
                throughput=record.throughput * scale,
                decode_ms_per_block=ms,
                decode_batch_tokens_per_s=record.decode_batch_tokens_per_s * scale,
                tp_speeds=tuple((tp, x * scale, tp_ms / scale) for tp, x, tp_ms in record.tp_speeds),
            )
        )
    return out
