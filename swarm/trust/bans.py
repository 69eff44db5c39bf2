"""Peers this machine caught lying, kept across restarts in the cache folder (bans.json).

A ban is written only on this process's own evidence: a step whose output a witness and a
third peer both recomputed and found wrong (client/verify.py). Reports read from the DHT are
other nodes' claims and never ban anyone here. Every client of this machine leaves a banned
peer out of its routes, and a later client starts with the bans already in place.

The file is a JSON map peer id -> Ban, at most MAX_BANS entries (the newest kept); writers
merge under a lock and replace the file whole (swarm/tools/cache_files.py). A ban lasts
BAN_TTL_S: a peer's operator may fix what made it wrong (a broken GPU, a bad driver), and a
ban read on a false proof must not last forever; a liar that lies again is banned again. An
operator lists the bans and lifts one with `hexswarm bans [--lift PEER_ID]`
(swarm/commands/bans_command.py); a running peer reads the file again every BANS_REFRESH_S
(peer/evidence_service.py), a client when it starts.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hexswarm.swarm.tools.cache_files import locked, write_atomically

logger = logging.getLogger(__name__)

MAX_BANS = 10_000
BAN_TTL_S = 30 * 24 * 3600.0
BANS_REFRESH_S = 10.0  # how often a running peer reads the file again (a ban lifted, or expired)


@dataclass(frozen=True)
class Ban:
    peer_id: str
    model_id: str
    start: int  # the blocks it computed wrong
    end: int
    reason: str
    time: float  # unix time of the ban


def bans_path() -> Path:
    base = os.environ.get("HEXSWARM_CACHE_DIR") or Path.home() / ".cache" / "hexswarm"
    return Path(base) / "bans.json"


def load_bans(path: Path | None = None, now: float | None = None) -> dict[str, Ban]:
    """The bans on file younger than BAN_TTL_S; none if it is missing or unreadable (logged)."""
    now = time.time() if now is None else now
    path = path or bans_path()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        logger.warning("ignoring the bans file %s: %s", path, e)
        return {}
    bans = {}
    for peer_id, entry in raw.items() if isinstance(raw, dict) else ():
        try:
            ban = Ban(**entry)
        except TypeError:
            continue
        if isinstance(ban.time, int | float) and now - BAN_TTL_S <= ban.time <= now + BAN_TTL_S:
            bans[peer_id] = ban
    return bans


def add_ban(ban: Ban, path: Path | None = None) -> None:
    """Adds `ban` to the file (merging with other processes' bans); logs if it cannot."""
    path = path or bans_path()
    try:
        with locked(path.with_name(".bans.lock")):
            bans = load_bans(path)
            bans[ban.peer_id] = ban
            _write(path, bans)
    except OSError as e:
        logger.warning("could not save the ban of %s to %s: %s", ban.peer_id, path, e)


def lift_ban(peer_id: str, path: Path | None = None) -> Ban | None:
    """Removes the ban of `peer_id` from the file; the ban lifted, None if there was none.
    Raises OSError if the file cannot be written."""
    path = path or bans_path()
    with locked(path.with_name(".bans.lock")):
        bans = load_bans(path)
        lifted = bans.pop(peer_id, None)
        if lifted is not None:
            _write(path, bans)
    return lifted


def _write(path: Path, bans: dict[str, Ban]) -> None:
    newest = sorted(bans.values(), key=lambda b: b.time)[-MAX_BANS:]
    write_atomically(path, json.dumps({b.peer_id: asdict(b) for b in newest}, indent=1).encode())


def new_ban(peer_id: str, model_id: str, start: int, end: int, reason: str) -> Ban:
    return Ban(peer_id, model_id, start, end, reason, time.time())
