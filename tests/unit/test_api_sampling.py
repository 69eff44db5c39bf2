"""The API server's sampler draws exactly what `generate(do_sample=True)` draws after
`torch.manual_seed(seed)`, from its own generator (so concurrent requests do not interfere)."""

from __future__ import annotations

import pytest
import torch

from hexswarm.client.api.generation import SamplingSettings, generation_kwargs


@pytest.fixture(scope="module")
def local_model(make_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(make_model(arch="llama", layers=2))


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9), (1.3, 0.5)])
def test_seeded_sampler_matches_generate(local_model, temperature, top_p):
    prompt = torch.tensor([[5, 17, 42, 99]])
    settings = SamplingSettings(max_tokens=24, temperature=temperature, top_p=top_p, seed=1234)
    torch.manual_seed(settings.seed)
    expected = local_model.generate(
        prompt, max_new_tokens=24, do_sample=True, temperature=temperature, top_p=top_p, top_k=0
    )
    torch.manual_seed(999)  # the sampler must not depend on the global RNG
    got = local_model.generate(prompt, **generation_kwargs(local_model, settings))
    assert got.tolist() == expected.tolist()


def test_temperature_zero_is_greedy(local_model):
    prompt = torch.tensor([[5, 17, 42, 99]])
    settings = SamplingSettings(max_tokens=16, temperature=0)
    expected = local_model.generate(prompt, max_new_tokens=16, do_sample=False)
    assert (
        local_model.generate(prompt, **generation_kwargs(local_model, settings)).tolist() == expected.tolist()
    )


def test_ignore_eos_runs_to_max_tokens_past_the_models_end(make_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = make_model(arch="llama")  # greedy output of this prompt ends after 22 tokens
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(model_dir),
        AutoTokenizer.from_pretrained(model_dir),
    )
    prompt = tokenizer("The quick brown fox", return_tensors="pt").input_ids
    ended = model.generate(prompt, **generation_kwargs(model, SamplingSettings(max_tokens=64, temperature=0)))
    assert ended[0, -1].item() == tokenizer.eos_token_id and ended.shape[1] < prompt.shape[1] + 64
    settings = SamplingSettings(max_tokens=64, temperature=0, ignore_eos=True)
    full = model.generate(prompt, **generation_kwargs(model, settings))
    assert full.shape[1] == prompt.shape[1] + 64
    assert full[0, : ended.shape[1]].tolist() == ended[0].tolist()  # the same tokens up to the end, then more
