"""What a model id costs: hashing speed, and the built-in model's id cold and cached.

Prints one JSON line:
- `sha256_mb_s`, `blake2b_mb_s`: hashlib's speed on a temporary file of `--mb` MB, read the way
  swarm/models/content_hash.py reads (8 MiB blocks), best of `--repeats` (the file is in the page
  cache after the first read, so this is the CPU's speed, the ceiling a fast disk allows);
- `gguf_mb`, `hash_cold_s`, `hash_cached_s`: the real SmolLM2 GGUF (built-in `smollm2-135m`)
  hashed with an empty digest cache, then found in the cache file;
- `id_cold_s`, `id_cached_s`: `model_identity("smollm2-135m")` in a fresh model cache (the hash
  plus converting the GGUF's metadata once), then again (what every later start pays);
- `sha256_threads_mb_s`: the same with `sha256_threads` files hashed at once, as a sharded
  checkpoint's shards are;
- `first_start_140gb_s`, `first_start_140gb_sharded_s`: 140 GB as one file (a GGUF) and as
  shards, what a 140 GB model's first start adds when the disk keeps up (a slower disk sets the
  pace instead: 140 GB at 500 MB/s is 280 s).

Run: python benchmarks/model_hash.py [--mb 400] [--repeats 3] [--save]
(--save: also write the line to benchmarks/results/model_hash.json)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_results import save, stamp

from hexswarm.swarm.models import content_hash
from hexswarm.swarm.models.builtin_models import BUILTIN_MODELS, DEFAULT_MODEL, builtin_path
from hexswarm.swarm.tools.cache_files import CACHE_ENV

MODEL_GB = 140


def hash_speed(path: Path, algorithm: str, repeats: int) -> float:
    """MB/s of `algorithm` over the file, best of `repeats`."""
    best = min(timed(lambda: content_hash.hash_file(path, algorithm=algorithm)) for _ in range(repeats))
    return path.stat().st_size / 1e6 / best


def timed(action) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def builtin_costs() -> dict:
    """Cold and cached hash and id of the built-in GGUF, in a fresh model cache."""
    from hexswarm.swarm.models.model_spec import model_identity

    gguf = builtin_path(BUILTIN_MODELS[DEFAULT_MODEL])
    if gguf is None:
        return {"gguf": None}
    with tempfile.TemporaryDirectory() as cache:
        os.environ[CACHE_ENV] = cache
        hash_cold = timed(lambda: content_hash.file_digest(gguf))
        hash_cached = timed(lambda: content_hash.file_digest(gguf))
        (Path(cache) / content_hash.CACHE_FILE).unlink()  # the id's cold start hashes again
        id_cold = timed(lambda: model_identity(DEFAULT_MODEL))
        id_cached = timed(lambda: model_identity(DEFAULT_MODEL))
    return {
        "gguf_mb": round(gguf.stat().st_size / 1e6, 1),
        "hash_cold_s": round(hash_cold, 3),
        "hash_cached_s": round(hash_cached, 4),
        "id_cold_s": round(id_cold, 2),
        "id_cached_s": round(id_cached, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=400, help="size of the temporary file to hash")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/model_hash.json")
    args = parser.parse_args()
    started = stamp()
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        for _ in range(args.mb):
            f.write(os.urandom(1 << 20))
        f.flush()
        speeds = {alg: hash_speed(Path(f.name), alg, args.repeats) for alg in ("sha256", "blake2b")}
        threads = min(content_hash.MAX_THREADS, os.cpu_count() or 1)
        with ThreadPoolExecutor(threads) as pool:  # shards are hashed this many at once
            began = time.perf_counter()
            list(pool.map(content_hash.hash_file, [Path(f.name)] * threads))
            parallel = threads * args.mb * (1 << 20) / 1e6 / (time.perf_counter() - began)
    result = {
        "file_mb": round(args.mb * (1 << 20) / 1e6),
        "sha256_mb_s": round(speeds["sha256"]),
        "blake2b_mb_s": round(speeds["blake2b"]),
        "sha256_threads": threads,
        "sha256_threads_mb_s": round(parallel),
        "first_start_140gb_s": round(MODEL_GB * 1e3 / speeds[content_hash.ALGORITHM]),
        "first_start_140gb_sharded_s": round(MODEL_GB * 1e3 / parallel),
        **builtin_costs(),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(result))
    if args.save:
        save("model_hash", {"bench": "model_hash", **result, "started": started, "ended": stamp()})


if __name__ == "__main__":
    main()
