"""What every role needs to know about a model checkpoint: its architecture, size and identity.

A model is named by a built-in name (`smollm2-135m`, swarm/models/builtin_models.py), a GGUF file
(read through a cached checkpoint folder, swarm/models/gguf_checkpoint.py) or a Hugging Face
checkpoint directory (config.json + safetensors). Peers and clients name it by a hash of
its whole content (swarm/models/model_id.py), so two checkpoints that differ in any weight never end
up in one chain, and one checkpoint keeps its id wherever it lies.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hexswarm.swarm.models import gguf_checkpoint, model_id
from hexswarm.swarm.models.architectures import SUPPORTED_FAMILIES, check_supported, localize_layer_settings
from hexswarm.swarm.models.builtin_models import BuiltinModelMissing, resolve_builtin

if TYPE_CHECKING:  # transformers is imported where a config is parsed: `model_identity` needs none
    from transformers import PretrainedConfig

# The model types peers and clients serve (their families: swarm/models/architectures.py).
SUPPORTED_MODEL_TYPES = tuple(SUPPORTED_FAMILIES)


class ModelSpecError(ValueError):
    """The directory is not a checkpoint hexswarm can serve."""


@dataclass(frozen=True)
class ModelSpec:
    """A checkpoint as the swarm sees it."""

    path: Path
    model_id: str  # "<name>-<content hash>", the key peers announce under
    model_type: str
    num_blocks: int  # transformer layers
    hidden_size: int
    config: PretrainedConfig

    def generation_config(self):
        """The checkpoint's generation_config.json, else the defaults its config implies."""
        from transformers import GenerationConfig

        try:
            return GenerationConfig.from_pretrained(self.path)
        except OSError:
            return GenerationConfig.from_model_config(self.config)

    def check_range(self, start: int, end: int) -> None:
        if not (0 <= start < end <= self.num_blocks):
            raise ModelSpecError(f"layer range {start}:{end} is not inside 0:{self.num_blocks}")


def resolve_checkpoint(model: str | Path) -> Path:
    """The checkpoint folder for what a user names: a built-in name, a GGUF file or a folder."""
    try:
        builtin = resolve_builtin(str(model))
        path = builtin or Path(model).expanduser().resolve()
        if path.is_file():
            return gguf_checkpoint.checkpoint_dir(path)
    except (BuiltinModelMissing, ValueError) as e:  # GGUFError, ContentHashError, unsupported architecture
        raise ModelSpecError(str(e)) from None
    if path.suffix == ".gguf" and not path.exists():
        raise ModelSpecError(f"{path}: no such GGUF file")
    return path


def load_model_spec(model: str | Path) -> ModelSpec:
    """The spec of a built-in model name, a GGUF file or a checkpoint directory."""
    from transformers import AutoConfig

    path = resolve_checkpoint(model)
    raw = _read_config(path)
    config = AutoConfig.from_pretrained(path)
    return ModelSpec(
        path=path,
        model_id=_model_id(path, raw),
        model_type=config.model_type,
        num_blocks=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        config=config,
    )


def model_identity(model: str | Path) -> tuple[str, int]:
    """(model id, number of blocks) without parsing the config through transformers
    (what `hexswarm status` needs: it saves a second of start-up)."""
    path = resolve_checkpoint(model)
    raw = _read_config(path)
    blocks = raw.get("num_hidden_layers")
    if not isinstance(blocks, int) or blocks <= 0:
        raise ModelSpecError(f"{path}/config.json: num_hidden_layers is {blocks!r}")
    return _model_id(path, raw), blocks


def _read_config(path: Path) -> dict:
    """config.json as a dict, once its model type is known to be supported."""
    if not (path / "config.json").is_file():
        raise ModelSpecError(f"{path} has no config.json: not a Hugging Face checkpoint directory")
    try:
        raw = json.loads((path / "config.json").read_text())
        check_supported(raw.get("model_type"), raw.get("architectures"))
    except (ValueError, AttributeError) as e:  # also JSON errors, and a config that is not an object
        raise ModelSpecError(f"{path}/config.json: {e}") from None
    return raw


def _model_id(path: Path, config: dict) -> str:
    """`<name>-<content hash>`; a GGUF file's folder carries the id of the file it came from."""
    manifest = gguf_checkpoint.manifest(path)
    if manifest is not None:
        return manifest["model_id"]
    try:
        return model_id.checkpoint_id(path, config)
    except (OSError, ValueError) as e:  # no weight files, unreadable ones, or one being written
        raise ModelSpecError(str(e)) from None


def config_for_blocks(config: PretrainedConfig, start: int, end: int) -> PretrainedConfig:
    """A copy of `config` describing only blocks [start, end), indexed from 0.

    A peer builds its layers with local indices against this config, so transformers' own
    cache (DynamicCache) and mask helpers work unchanged on a slice of the model.
    """
    local = copy.deepcopy(config)
    local.num_hidden_layers = end - start
    localize_layer_settings(config, local, start, end)
    return local
