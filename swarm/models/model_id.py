"""Model ids: a readable name plus a hash of the model's whole content.

Peers announce under the model id and clients look it up, so the id decides who forms a swarm
together. It is `<name>-<hash>`:

- the hash covers every byte of every weight file and the config that defines the architecture,
  so two checkpoints that differ in any weight never share a swarm (clients would otherwise get
  layers of two models), and nothing else: not the folder's name or place, so one checkpoint
  copied to two folders, or two machines, forms one swarm;
- the name is for people (`llama-135M`, `smollm2-135M`) and is derived from that same content
  (the config's model type and the weights' parameter count, or a GGUF file's metadata), so it
  cannot split a swarm either. The API accepts the id with or without its hash.

Sixteen hex digits (64 bits) keep accidental collisions out of reach (about 2^32 distinct
models before one is likely). The id is what a peer says it serves, not a proof: a hostile peer
can announce any id. Output verification answers that (a second peer recomputes sampled steps).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

from hexswarm.swarm.models import content_hash

ID_HASH_CHARS = 16  # hex digits of the content hash in an id
# config.json fields that say who saved the file, not what the model is: two saves of one
# checkpoint by other transformers versions, or from other folders, keep one id.
_NOT_ARCHITECTURE = ("_name_or_path", "transformers_version")
_ID_DOMAIN = b"hexswarm model id v1\n"  # changes every id when what the hash covers changes


def readable_id(name: str, digest: str) -> str:
    """`<name>-<first ID_HASH_CHARS hex digits of digest>`, the name reduced to [A-Za-z0-9._-]."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"
    return f"{safe}-{digest[:ID_HASH_CHARS]}"


def checkpoint_id(model_dir: Path, config: dict) -> str:
    """The id of a safetensors checkpoint folder: `<model type>-<size>-<hash>`.

    `config` is the folder's config.json, already parsed. Hashes every weight file in full (once;
    swarm/models/content_hash.py caches each file's digest by its identity).
    """
    weight_files = sorted(Path(model_dir).glob("*.safetensors"))
    if not weight_files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors weight files")
    digests = content_hash.file_digests(weight_files, Path(model_dir).name)
    digest = hashlib.sha256(_ID_DOMAIN + canonical_config(config))
    for weight_file, file_digest in zip(weight_files, digests, strict=True):
        digest.update(f"{weight_file.name}\0{file_digest}\n".encode())
    name = f"{config.get('model_type', 'model')}-{size_label(parameter_count(weight_files))}"
    return readable_id(name, digest.hexdigest())


def canonical_config(config: dict) -> bytes:
    """config.json's architecture fields as canonical JSON (sorted keys, no spaces)."""
    kept = {key: value for key, value in config.items() if key not in _NOT_ARCHITECTURE}
    return json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()


def parameter_count(weight_files: list[Path]) -> int:
    """Number of weights in the files, from their safetensors headers (no tensor data is read)."""
    from safetensors import SafetensorError, safe_open

    total = 0
    for weight_file in weight_files:
        try:
            with safe_open(weight_file, framework="numpy") as f:
                total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
        except SafetensorError as e:
            raise ValueError(f"{weight_file} is not a readable safetensors file: {e}") from None
    return total


def size_label(parameters: int) -> str:
    """A parameter count as model cards write it: 950, 2.1K, 135M, 1.7B, 70B."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if parameters >= scale:
            value = parameters / scale
            text = f"{value:.1f}".removesuffix(".0") if value < 10 else f"{value:.0f}"
            return f"{text}{suffix}"
    return str(parameters)
