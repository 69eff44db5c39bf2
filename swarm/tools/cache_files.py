"""The model cache's folder, and the two ways its files are written safely by many processes at once.

Peers, clients and `hexswarm status` on one machine share the cache: a lock orders writers
that merge into one file, and a write lands whole (a reader sees the old file or the new one,
never half of one) because it goes to a private temporary name first and is renamed over.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

CACHE_ENV = "HEXSWARM_MODEL_CACHE"  # apart from HEXSWARM_CACHE_DIR (measurements), which tests isolate


def cache_root() -> Path:
    """Where converted checkpoints and content hashes live: $HEXSWARM_MODEL_CACHE, else
    ~/.cache/hexswarm/models."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hexswarm" / "models"


def write_atomically(path: Path, data: bytes) -> None:
    """Writes `path` whole: to a name private to this process, then renamed over `path`."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_bytes(data)
    os.replace(part, path)


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """An exclusive lock across processes on `lock_path` (its folder is created if missing)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
