"""GGUF files as checkpoints: each file gets a cached Hugging Face checkpoint folder, filled block by block.

Reading a GGUF through transformers costs seconds for the config and tokenizer and de-quantizes
every tensor of the model. A peer needs only its own blocks, and restarts, tests and the other
peers of one machine read the same file again and again. So the first reader of a file writes,
into a folder of the cache keyed by the file's content (the SHA-256 of every byte, computed once
and cached by swarm/models/content_hash.py; not its path):

- `config.json`, the tokenizer files (chat template included) and `generation_config.json`,
  converted once by transformers' own GGUF readers;
- `model.safetensors.index.json`, naming one safetensors file per block and one for the rest
  (embeddings, final norm, LM head), and `gguf.json`, which GGUF tensors each file holds;

and the weight files are written only when someone first reads a tensor in them
(`materialize`): the GGUF file is memory-mapped, just that file's tensors are de-quantized
(transformers' tensor processor undoes llama.cpp's q/k permutation) and saved. Everything
downstream (peers, TP shards, clients) then reads an ordinary safetensors checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from hexswarm.swarm.models import content_hash
from hexswarm.swarm.models.model_id import readable_id
from hexswarm.swarm.tools.cache_files import cache_root, locked, write_atomically

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
MANIFEST = "gguf.json"  # marks a folder as a GGUF file's checkpoint; which tensors each weight file holds
_SHARED_FILE = "model-shared.safetensors"  # embeddings, final norm, LM head
_FORMAT = 2  # bump when the folder's layout changes, so old caches are rebuilt (2: ids hash every byte)


class GGUFError(ValueError):
    """The file is not a GGUF checkpoint hexswarm can read."""


def is_gguf(path: Path) -> bool:
    """Whether `path` is a file that starts with GGUF's magic bytes."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def checkpoint_dir(gguf_path: Path) -> Path:
    """The cached checkpoint folder of a GGUF file, converting its metadata on first use."""
    gguf_path = gguf_path.expanduser().resolve()
    if not is_gguf(gguf_path):
        raise GGUFError(f"{gguf_path} is not a GGUF file (no GGUF magic bytes)")
    digest = content_hash.file_digest(gguf_path)
    folder = _folder(digest)
    if not (folder / MANIFEST).is_file():
        with _locked(folder):
            if not (folder / MANIFEST).is_file():
                _convert_metadata(gguf_path, digest, folder)
    _remember_source(folder, gguf_path)
    return folder


def cached_model_id(gguf_path: Path) -> str | None:
    """The model id of a GGUF file that was read here before (None otherwise): cheap, it reads
    no weights (the file's hash comes from the cache) and converts nothing."""
    digest = content_hash.cached_file_digest(gguf_path)
    record = manifest(_folder(digest)) if digest is not None else None
    return record["model_id"] if record else None


def _folder(digest: str) -> Path:
    """Keyed by the file's full SHA-256: one folder per content, wherever the file lies."""
    return cache_root() / f"gguf-{digest}-v{_FORMAT}"


def manifest(folder: Path) -> dict | None:
    """The folder's GGUF manifest, or None for an ordinary safetensors checkpoint."""
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def materialize(folder: Path, weight_files: Iterable[Path]) -> None:
    """Writes the weight files of a GGUF checkpoint folder that are not there yet.

    De-quantizes only the tensors those files hold, from the memory-mapped GGUF file.
    Safe against other processes doing the same (a lock per folder, atomic renames).
    """
    missing = sorted({Path(p).name for p in weight_files if not Path(p).is_file()})
    if not missing or not (folder / MANIFEST).is_file():  # complete, or not a GGUF file's folder
        return
    with _locked(folder):
        missing = [name for name in missing if not (folder / name).is_file()]
        if missing:
            _write_weight_files(folder, missing)


def materialize_all(folder: Path) -> None:
    """Writes every weight file, so that transformers can load the folder as a whole model."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    materialize(folder, [folder / name for name in set(index["weight_map"].values())])


def _model_name(reader) -> str:
    """The model's name from the file's metadata (`smollm2-135M`), so renaming the file keeps its id;
    the architecture when the metadata names none (never the file's name: it would split a swarm)."""
    parts = [_string_field(reader, key) for key in ("general.basename", "general.size_label")]
    return "-".join(p for p in parts if p) or _string_field(reader, "general.name") or _architecture(reader)


def _string_field(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    try:
        return bytes(field.parts[field.data[0]]).decode()
    except (UnicodeDecodeError, TypeError):
        return None


def _convert_metadata(gguf_path: Path, digest: str, folder: Path) -> None:
    """config.json, tokenizer, generation config, the weight index and the manifest."""
    began = time.perf_counter()
    logger.info("%s: converting GGUF metadata (config, tokenizer) once into %s", gguf_path.name, folder)
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from hexswarm.swarm.models.architectures import UnsupportedArchitectureError, check_supported

    config = _read_with(AutoConfig, gguf_path)
    try:
        check_supported(config.model_type, config.architectures)
    except UnsupportedArchitectureError as e:
        raise GGUFError(f"{gguf_path}: {e}") from None
    tokenizer = _read_with(AutoTokenizer, gguf_path)
    reader = _reader(gguf_path)
    architecture = _architecture(reader)
    files = _weight_files(reader, architecture, config)
    if not any(name.startswith("model-block-") for name in files):
        raise GGUFError(f"{gguf_path}: no transformer block tensors found")
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=folder))
    config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    GenerationConfig.from_model_config(config).save_pretrained(staging)
    weight_map = {hf: file for file, pairs in files.items() for _, hf in pairs}
    (staging / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    for item in staging.iterdir():
        os.replace(item, folder / item.name)
    staging.rmdir()
    record = {
        "format": _FORMAT,
        "model_id": readable_id(_model_name(reader), digest),
        "content_hash": digest,
        "architecture": architecture,
        "files": files,
    }
    write_atomically(folder / MANIFEST, json.dumps(record).encode())
    logger.info("%s: metadata converted in %.1f s", gguf_path.name, time.perf_counter() - began)


def _read_with(auto_class, gguf_path: Path):
    """transformers' own GGUF reader (AutoConfig, AutoTokenizer); a failure becomes a one-line GGUFError."""
    try:
        return auto_class.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except Exception as e:  # noqa: BLE001 - truncated files raise anything from struct errors to IndexError
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise GGUFError(f"{gguf_path}: cannot read it as a GGUF checkpoint: {reason}") from None


def _architecture(reader) -> str:
    return _string_field(reader, "general.architecture") or "unknown"


def _reader(gguf_path: Path):
    from gguf import GGUFReader

    try:
        return GGUFReader(gguf_path)  # memory-maps the file; reads the metadata and tensor table
    except Exception as e:  # noqa: BLE001 - a truncated file fails in numpy's memmap or struct reads
        raise GGUFError(f"{gguf_path}: cannot read it as a GGUF file: {e}") from None


def _weight_files(reader, architecture: str, config) -> dict[str, list[tuple[str, str]]]:
    """Weight file name -> [(GGUF tensor name, Hugging Face name)], a file per block plus one shared.

    The name map is transformers' (`get_gguf_hf_weights_map`), built against the model's own
    class on the meta device; GGUF tensors it does not map (e.g. precomputed rope factors) are
    not part of the model and are skipped, as transformers skips them.
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = get_gguf_hf_weights_map(model, _processor(architecture, config.to_dict()))
    files: dict[str, list[tuple[str, str]]] = {}
    for tensor in reader.tensors:
        hf_name = names.get(tensor.name)
        if hf_name is None:
            continue
        files.setdefault(_file_for(hf_name), []).append((tensor.name, hf_name))
    return files


def _file_for(hf_name: str) -> str:
    parts = hf_name.split(".")
    if parts[:2] == ["model", "layers"] and len(parts) > 2 and parts[2].isdigit():
        return f"model-block-{int(parts[2]):05d}.safetensors"
    return _SHARED_FILE


def _processor(architecture: str, config: dict):
    """transformers' tensor processor for the architecture (Llama's undoes the q/k permutation)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    processor_class = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
    if processor_class.perform_fallback_tensor_mapping is not TensorProcessor.perform_fallback_tensor_mapping:
        # mixture-of-experts processors regroup expert tensors across names: not one file per block
        raise GGUFError(f"GGUF checkpoints of the {architecture!r} architecture are not supported yet")
    return processor_class(config=config)


def _write_weight_files(folder: Path, names: list[str]) -> None:
    import numpy as np
    import torch
    from gguf import dequantize
    from safetensors.torch import save_file

    record = manifest(folder)
    source = Path((folder / "source").read_text())
    config = json.loads((folder / "config.json").read_text())
    processor = _processor(record["architecture"], config)
    began = time.perf_counter()
    tensors_by_name = {t.name: t for t in _reader(source).tensors}
    for name in names:
        tensors = {}
        for gguf_name, hf_name in record["files"][name]:
            tensor = tensors_by_name.get(gguf_name)
            if tensor is None:
                raise GGUFError(
                    f"{source} lacks tensor {gguf_name} (the file changed since {folder} was made?)"
                )
            weights = dequantize(tensor.data, tensor.tensor_type)
            weights = processor.process(weights=weights, name=gguf_name).weights
            tensors[hf_name] = torch.from_numpy(np.copy(weights))  # the mapped file is read-only
        part = folder / f".{name}.{os.getpid()}.part"
        save_file(tensors, part)
        os.replace(part, folder / name)
    logger.info(
        "%s: de-quantized %d weight file(s) in %.1f s (cached in %s)",
        source.name,
        len(names),
        time.perf_counter() - began,
        folder,
    )


def _remember_source(folder: Path, gguf_path: Path) -> None:
    """The GGUF file this folder's weights are read from (the same content may move)."""
    source = folder / "source"
    if not source.is_file() or source.read_text() != str(gguf_path):
        write_atomically(source, str(gguf_path).encode())


def _locked(folder: Path):
    """An exclusive lock on `folder` (created if missing) across processes."""
    return locked(folder / ".lock")
