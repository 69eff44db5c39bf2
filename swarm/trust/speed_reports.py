"""Decode speeds that clients observed, shared so that the coordinator, `status` and the monitor
judge peers by what was measured, not by what they announce (client/observed.py measures them).

Layout (one DHT key per model; one entry per reporter, under a subkey its key signs):

    hexswarm/v1/observed/<model_id>   subkey [owner:<reporter's public key>]
                                      ->  msgpack {"schema": 1, "peers": {peer id: [ms, samples]}}

`ms` is the reporter's median decode ms per block of that peer over its last `samples` steps.

Combining (`combine`): a peer's observed figure is the median over the reporters that saw it,
and counts only once MIN_REPORTERS distinct reporters did: one client (or one that restarts under
a new key) cannot move a plan. A figure is only ever used to slow a peer down, never to speed it
up, and only when its announcement is more than TRUST_FACTOR times faster (client timing includes
overheads that the announced compute does not). So a boaster cannot buy speed with reports of
its own, and honest clients that saw it are what it takes to plan it at its real speed.

What this does not stop: reporters are keys, and a DHT entry does not tell which IP group stored
it. A machine posing as MIN_REPORTERS clients, outnumbering the honest reporters of a peer, can
make planners see an honest peer as slower than it is (`status` then lists the peer as flagged,
with the number of reporters). Each client still routes by its own observations.
"""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from hexswarm.swarm.net.dht_read import get_latest
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


def observed_key(model_id: str) -> str:
    return f"{OBSERVED_KEY}/{model_id}"


def encode(speeds: Mapping[str, tuple[float, int]]) -> bytes:
    """A reporter's entry: peer id -> (median ms per block, samples)."""
    peers = {p: [float(ms), int(n)] for p, (ms, n) in list(speeds.items())[:MAX_PEERS]}
    return msgpack.packb({"schema": SCHEMA, "peers": peers}, use_bin_type=True)


def decode(data: Any) -> dict[str, tuple[float, int]]:
    """One entry (remote input); ValueError if it is malformed or out of range."""
    body = unpack_map(data, max_bytes=64 * 1024)
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


def read(dht, model_id: str, timeout: float | None = None) -> dict[str, dict[str, tuple[float, int]]]:
    """reporter id -> its entry, for every well-formed signed entry of `model_id`."""
    return dict(parse_signed_entries(get_latest(dht, observed_key(model_id), timeout), decode))


@dataclass(frozen=True)
class Observed:
    """What clients observed of one peer, combined."""

    ms_per_block: float  # the median over reporters
    reporters: int


def combine(entries: Mapping[str, Mapping[str, tuple[float, int]]]) -> dict[str, Observed]:
    """peer id -> its combined figure, for peers seen by MIN_REPORTERS reporters or more."""
    seen: dict[str, list[float]] = defaultdict(list)
    for reporter, speeds in entries.items():
        for peer_id, (ms, _) in speeds.items():
            if peer_id != reporter:  # a peer's report on itself is no observation
                seen[peer_id].append(ms)
    return {
        peer_id: Observed(statistics.median(figures), len(figures))
        for peer_id, figures in seen.items()
        if len(figures) >= MIN_REPORTERS
    }


def over_announced(record: PeerRecord, observed: Mapping[str, Observed]) -> Observed | None:
    """What clients observed of `record`'s peer, if it announces itself over TRUST_FACTOR faster."""
    figure = observed.get(record.peer_id)
    if figure is None or figure.ms_per_block <= TRUST_FACTOR * record.decode_ms_per_block:
        return None
    return figure


def as_observed(records: Sequence[PeerRecord], observed: Mapping[str, Observed]) -> list[PeerRecord]:
    """`records` with each over-announcing peer's speeds slowed to what clients observed: its
    decode time set to the observed one, its throughputs (and per-degree figures) scaled alike."""
    out = []
    for record in records:
        figure = over_announced(record, observed)
        if figure is None:
            out.append(record)
            continue
        scale = record.decode_ms_per_block / figure.ms_per_block
        out.append(
            replace(
                record,
                throughput=record.throughput * scale,
                decode_ms_per_block=figure.ms_per_block,
                decode_batch_tokens_per_s=record.decode_batch_tokens_per_s * scale,
                tp_speeds=tuple((tp, x * scale, ms / scale) for tp, x, ms in record.tp_speeds),
            )
        )
    return out
