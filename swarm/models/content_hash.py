"""Content hashes of checkpoint files: every byte, hashed once per file and cached by the file's identity.

A model id must change when any weight changes, so it is built from a hash of every byte of the
weights. Reading a 140 GB checkpoint takes minutes, though, so each file's digest is kept in a
small JSON file in the model cache, keyed by the file's path and identity (size, mtime_ns, inode,
device). A restart, a second peer on the same machine and `hexswarm status` find the digest there
and read nothing; a file that is rewritten, copied or replaced has another identity and is hashed
again. The same scheme guards build tools' caches (ninja's and git's index keep a file's stat
data to decide whether to read it again).

The algorithm is SHA-256: with the CPU's SHA extensions it runs ~1.4x faster than BLAKE2b here
(benchmarks/model_hash.py), and a safetensors shard's SHA-256 is the digest the Hugging Face Hub
shows for that file (its LFS object id), so a volunteer can check a shard against the Hub by eye.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from hexswarm.swarm.tools.cache_files import cache_root, locked, write_atomically

logger = logging.getLogger(__name__)

ALGORITHM = "sha256"
CACHE_FILE = "content-hashes.json"
_CACHE_SCHEMA = 1  # bump when an entry's fields change: older files are then ignored
_MAX_ENTRIES = 1024  # files remembered; the oldest are dropped first
_BUFFER_BYTES = 8 << 20  # per read: large enough that the hash, not the syscalls, sets the pace
_PROGRESS_EVERY_S = 5.0  # a log line this often while a long hash runs
MAX_THREADS = 4  # shards hashed at once: hashlib releases the GIL, so threads use several cores
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


class ContentHashError(ValueError):
    """A file could not be hashed: it changed while it was read."""


@dataclass(frozen=True)
class FileIdentity:
    """What says a file is unchanged without reading it: a rewrite changes size or mtime, a copy
    or a replacement (rename over it) changes the inode."""

    size: int
    mtime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity:
        stat = path.stat()
        return cls(stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_dev)


def file_digest(path: Path) -> str:
    """The SHA-256 (hex) of every byte of `path`, from the cache when the file is unchanged."""
    return file_digests([path], path.name)[0]


def file_digests(paths: Sequence[Path], label: str) -> list[str]:
    """The SHA-256 (hex) of each file, in order. Files the cache does not know are read in full,
    several at once, with one progress line every few seconds under `label`; then remembered."""
    paths = [Path(p).expanduser().resolve() for p in paths]
    identities = [FileIdentity.of(p) for p in paths]
    known = _load_cache()
    digests = [_lookup(known, p, i) for p, i in zip(paths, identities, strict=True)]
    missing = [k for k, digest in enumerate(digests) if digest is None]
    if missing:
        progress = _Progress(label, sum(identities[k].size for k in missing))
        with ThreadPoolExecutor(min(MAX_THREADS, len(missing)), thread_name_prefix="hash") as pool:
            hashed = pool.map(lambda k: _hash_unchanged(paths[k], identities[k], progress), missing)
            for k, digest in zip(missing, hashed, strict=True):
                digests[k] = digest
        progress.finish()
        try:
            _remember({str(paths[k]): (identities[k], digests[k]) for k in missing})
        except OSError as e:  # a read-only cache: correct ids still, only the next start hashes again
            logger.warning("cannot remember content hashes in %s: %s", cache_root() / CACHE_FILE, e)
    return digests


def cached_file_digest(path: Path) -> str | None:
    """The file's digest if the cache holds it for the file as it is now; reads no weights."""
    path = Path(path).expanduser().resolve()
    return _lookup(_load_cache(), path, FileIdentity.of(path)) if path.is_file() else None


def hash_file(path: Path, progress: _Progress | None = None, algorithm: str = ALGORITHM) -> str:
    """The digest (hex) of every byte of `path`, read in large blocks; no cache."""
    digest = hashlib.new(algorithm)
    buffer = bytearray(_BUFFER_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while read := f.readinto(buffer):
            digest.update(view[:read])
            if progress is not None:
                progress.advance(read)
    return digest.hexdigest()


def _hash_unchanged(path: Path, identity: FileIdentity, progress: _Progress) -> str:
    """hash_file, refusing a file that changed meanwhile (its digest would name no real content)."""
    digest = hash_file(path, progress)
    if FileIdentity.of(path) != identity:
        raise ContentHashError(f"{path} changed while it was being hashed: start again once it is complete")
    return digest


class _Progress:
    """Bytes hashed so far, logged every few seconds (shared by the hashing threads)."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done = label, total, 0
        self.began = self.last_log = time.monotonic()
        self.lock = threading.Lock()

    def advance(self, read: int) -> None:
        with self.lock:
            self.done += read
            now = time.monotonic()
            if now - self.last_log < _PROGRESS_EVERY_S:
                return
            self.last_log = now
        logger.info(
            "%s: hashing the weights once (cached afterwards): %.1f of %.1f GB, %.0f MB/s",
            self.label,
            self.done / 1e9,
            self.total / 1e9,
            self.done / 1e6 / (now - self.began),
        )

    def finish(self) -> None:
        elapsed = time.monotonic() - self.began
        if elapsed >= _PROGRESS_EVERY_S:
            logger.info("%s: hashed %.1f GB in %.0f s", self.label, self.total / 1e9, elapsed)


# --- the cache file: {"schema", "algorithm", "files": {path: identity fields + "digest"}} ---


def _lookup(known: dict[str, dict], path: Path, identity: FileIdentity) -> str | None:
    entry = known.get(str(path))
    if entry is None or _identity_of(entry) != identity:
        return None
    return entry["digest"]


def _load_cache() -> dict[str, dict]:
    """Path -> entry, keeping only well-formed entries (a damaged file costs a re-hash, no more)."""
    try:
        raw = json.loads((cache_root() / CACHE_FILE).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # unreadable, or not JSON
        logger.warning("ignoring the content-hash cache %s: %s", cache_root() / CACHE_FILE, e)
        return {}
    if not isinstance(raw, dict) or raw.get("schema") != _CACHE_SCHEMA or raw.get("algorithm") != ALGORITHM:
        return {}
    files = raw.get("files")
    if not isinstance(files, dict):
        return {}
    return {path: entry for path, entry in files.items() if _well_formed(entry)}


def _well_formed(entry: object) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("digest"), str):
        return False
    numbers = [entry.get(name) for name in ("size", "mtime_ns", "inode", "device")]
    is_count = all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers)
    return is_count and _HEX_DIGEST.fullmatch(entry["digest"]) is not None


def _identity_of(entry: dict) -> FileIdentity:
    return FileIdentity(entry["size"], entry["mtime_ns"], entry["inode"], entry["device"])


def _remember(new: dict[str, tuple[FileIdentity, str]]) -> None:
    """Adds entries to the cache file: under a lock, merged with what other processes wrote
    meanwhile, without entries whose file changed or is gone, at most _MAX_ENTRIES."""
    root = cache_root()
    with locked(root / f".{CACHE_FILE}.lock"):
        files = _load_cache()
        for path, (identity, digest) in new.items():
            files.pop(path, None)  # re-inserted last: the newest entries are kept longest
            files[path] = {**asdict(identity), "digest": digest}
        kept = dict(list((p, e) for p, e in files.items() if _still_there(p, e))[-_MAX_ENTRIES:])
        body = json.dumps({"schema": _CACHE_SCHEMA, "algorithm": ALGORITHM, "files": kept})
        write_atomically(root / CACHE_FILE, body.encode())


def _still_there(path: str, entry: dict) -> bool:
    try:
        return FileIdentity.of(Path(path)) == _identity_of(entry)
    except OSError:
        return False
