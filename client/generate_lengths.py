"""How long a `generate()` call's sequences get, and the arguments that start one again from a
token (a rollback after a proven lie, client/model.py)."""

from __future__ import annotations

import torch


def generation_length(inputs, kwargs: dict, default_config) -> int:
    """Prompt plus new tokens, as `generate` will count them from its arguments."""
    prompt = inputs if inputs is not None else kwargs.get("input_ids", kwargs.get("inputs_embeds"))
    prompt_len = prompt.shape[1] if prompt is not None else 1
    config = kwargs.get("generation_config") or default_config
    if kwargs.get("max_new_tokens") is not None:
        return prompt_len + kwargs["max_new_tokens"]
    if kwargs.get("max_length") is not None:
        return kwargs["max_length"]
    if config.max_new_tokens is not None:
        return prompt_len + config.max_new_tokens
    return max(config.max_length, prompt_len + 1)


def rollback_arguments(inputs, kwargs: dict, tokens: torch.Tensor, position: int, total: int):
    """(inputs, kwargs) for generating the rest of `total` tokens again from the tokens up to and
    including `position`, never cutting into the prompt."""
    prompt = inputs if inputs is not None else kwargs.get("input_ids")
    keep = max(prompt.shape[1] if prompt is not None else 1, min(position + 1, tokens.shape[1]))
    kept = {k: v for k, v in kwargs.items() if k not in ("max_length", "input_ids", "attention_mask")}
    kept["max_new_tokens"] = total - keep
    if "attention_mask" in kwargs:
        kept["attention_mask"] = torch.ones_like(tokens[:, :keep])
    return tokens[:, :keep], kept
