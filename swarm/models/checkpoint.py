"""Load just the tensors a role needs from a (possibly sharded) safetensors checkpoint."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
from safetensors import safe_open

from hexswarm.swarm.models import gguf_checkpoint
from hexswarm.swarm.tools import log_setup


class CheckpointError(ValueError):
    """A tensor the role needs is missing or malformed in the checkpoint."""


def tensor_locations(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (reads the shard index if there is one)."""
    index_file = model_dir / "model.safetensors.index.json"
    if index_file.is_file():
        weight_map = json.loads(index_file.read_text())["weight_map"]
        return {name: model_dir / file_name for name, file_name in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise CheckpointError(f"{model_dir} has neither model.safetensors nor model.safetensors.index.json")
    with safe_open(single, framework="pt") as f:
        return {name: single for name in f.keys()}


# (tensor name, its full shape) -> the part to read, one slice per leading dimension; None = all of it
SliceOf = Callable[[str, list[int]], tuple[slice, ...] | None]


def load_tensors(
    model_dir: Path,
    wanted: Callable[[str], bool],
    dtype: torch.dtype,
    on_file: Callable[[Path, int], None] | None = None,
    slice_of: SliceOf | None = None,
    progress: str | None = "reading",
) -> dict[str, torch.Tensor]:
    """Reads every tensor whose name `wanted` accepts, file by file, cast to `dtype`.

    `on_file(path, n_tensors)` is called before each file is read, for progress logs.
    `slice_of` picks part of a tensor (a tensor-parallel rank's shard); only that part's
    bytes are read from the file (safetensors `get_slice`).
    `progress` names a progress bar over the tensors read (shown on a terminal only; None: no bar).
    """
    model_dir = Path(model_dir)
    by_file: dict[Path, list[str]] = {}
    for name, path in tensor_locations(model_dir).items():
        if wanted(name):
            by_file.setdefault(path, []).append(name)
    gguf_checkpoint.materialize(model_dir, by_file)  # a GGUF file's folder: de-quantize what is read
    tensors: dict[str, torch.Tensor] = {}
    total = sum(len(names) for names in by_file.values())
    bar_or_not = log_setup.progress(total=total, desc=progress, unit="tensor") if progress else nullcontext()
    with bar_or_not as bar:
        for path, names in sorted(by_file.items()):
            if on_file is not None:
                on_file(path, len(names))
            with safe_open(path, framework="pt") as f:
                for name in names:
                    tensors[name] = _read(f, name, dtype, slice_of)
                    if bar is not None:
                        bar.update()
    return tensors


def _read(f, name: str, dtype: torch.dtype, slice_of: SliceOf | None) -> torch.Tensor:
    part = None
    if slice_of is not None:
        view = f.get_slice(name)
        part = slice_of(name, list(view.get_shape()))
    return (f.get_tensor(name) if part is None else view[part]).to(dtype)


def strip_prefix(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}
