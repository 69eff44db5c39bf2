"""What both coordinator commands read the same way: the model a plan is for and its workload
flags (`hexswarm coordinator`, command.py, and `hexswarm plan`, plan_command.py)."""

from __future__ import annotations

import json
import os

from hexswarm.routing.scheduler.model_spec import OBJECTIVES
from hexswarm.swarm.commands import cli_args


def add_workload_arguments(group) -> None:
    """--rate, --s-in, --s-out and --objective: the workload a plan is for."""
    group.add_argument(
        "--rate", type=cli_args.positive_float, default=1.0, help="requests per second to plan for"
    )
    group.add_argument(
        "--s-in", type=cli_args.positive_int, default=128, help="mean prompt tokens to plan for"
    )
    group.add_argument(
        "--s-out", type=cli_args.positive_int, default=32, help="generated tokens per request to plan for"
    )
    group.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="slo",
        help="slo: most requests within the deadline at --rate; throughput: most tokens/s, no deadline "
        "(--rate and --slo-scale then unused)",
    )


def load_model(name_or_dir: str):
    """A preset by name, or the config.json of a built-in model, a GGUF file or a checkpoint directory."""
    from hexswarm.routing.scheduler.model_spec import PRESETS, ModelSpec, preset
    from hexswarm.swarm.models.builtin_models import BUILTIN_MODELS
    from hexswarm.swarm.models.model_spec import resolve_checkpoint

    if name_or_dir in BUILTIN_MODELS or os.path.isfile(name_or_dir):
        folder = resolve_checkpoint(name_or_dir)  # a GGUF file's converted config
        return ModelSpec.from_hf_config(
            json.loads((folder / "config.json").read_text()), os.path.basename(name_or_dir)
        )
    if os.path.isdir(name_or_dir):
        config = read_json_object(os.path.join(name_or_dir, "config.json"))
        return ModelSpec.from_hf_config(config, os.path.basename(os.path.normpath(name_or_dir)))
    try:
        return preset(name_or_dir)
    except KeyError:
        raise ValueError(
            f"model {name_or_dir!r} is not a built-in name ({', '.join(BUILTIN_MODELS)}), a GGUF file, "
            f"a checkpoint folder or a preset ({', '.join(PRESETS)})"
        ) from None


def read_json_object(path: str) -> dict:
    """The JSON object in `path`; ValueError (with the path) for bad JSON or another value."""
    with open(path, encoding="utf-8") as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return raw
