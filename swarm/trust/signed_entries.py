"""Reading a DHT dictionary whose entries each belong to the peer that signed them.

Every kind of value peers publish (records, model entries, reports, evidence holdings, speed
reports, the coordinator's leases and plans) sits under a subkey that names its owner's public
key, and hivemind's validator refuses a change not signed by that key. A reader turns such a
dictionary into (owner's peer id, parsed value) pairs, and skips, never raises on, whatever the
network sent malformed: a bad subkey, or a value that does not parse. A bad value is logged once
per owner and reason, in a bounded set, because values are re-read every few seconds and a
hostile peer must not be able to flood its readers' logs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

MAX_WARNED = 4096
_warned: dict[tuple[str, str], None] = {}  # (peer id, reason) already logged, oldest first
_warned_lock = threading.Lock()  # a client reads records from several threads (the API's)


def parse_signed_entries(
    dict_value: Any, parse, owner_marker: Callable[[bytes], bytes] = lambda subkey: subkey
):
    """Turns a hivemind dictionary value {subkey: ValueWithExpiration} into [(peer_id, parsed)],
    keeping only entries that parse and whose subkey is an owner marker (or, with `owner_marker`,
    holds one that it extracts: subkeys that also name what the entry is about)."""
    # here, not at the top: an edge peer (peer/edge/) builds records in a process without hivemind
    from hexswarm.swarm.net.identity import peer_id_from_owner_marker

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
