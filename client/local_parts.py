"""The parts of a model a client runs itself: embeddings, final norm and LM head, in the model's
own Hugging Face class with zero transformer layers (the swarm runs those)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from hexswarm.swarm.models import architectures
from hexswarm.swarm.models.checkpoint import load_tensors
from hexswarm.swarm.models.model_spec import ModelSpec, config_for_blocks


def build_local_parts(mixin: type, spec: ModelSpec, dtype: torch.dtype):
    """The model's own HF class, with `mixin` in front of it and zero layers, holding the real
    embeddings, norm and head."""
    base = AutoModelForCausalLM._model_mapping[type(spec.config)]
    model_cls = type(f"Distributed{base.__name__}", (mixin, base), {})
    shell = config_for_blocks(spec.config, 0, 0)
    architectures.choose_implementations(shell)
    with architectures.parameters_on_meta():  # buffers (e.g. Gemma's embedding scale) stay real
        model = model_cls(shell)
    wanted = ("model.embed_tokens.", "model.norm.", "lm_head.")
    tensors = load_tensors(spec.path, lambda name: name.startswith(wanted), dtype)
    if "lm_head.weight" not in tensors and getattr(spec.config, "tie_word_embeddings", False):
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    model.load_state_dict(tensors, assign=True, strict=False)
    still_meta = [name for name, p in model.named_parameters() if p.is_meta]
    if still_meta:
        raise ValueError(f"{spec.path} lacks tensors the client needs: {still_meta}")
    model.generation_config = spec.generation_config()
    model.eval()
    return model
