"""Incremental detokenization for the API: deltas add up to decode(ids), cut at the first stop string."""

from __future__ import annotations

import pytest

from hexswarm.client.api.text import TextAssembler


@pytest.fixture(scope="module")
def tokenizer(make_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(make_model(arch="llama", layers=2))


TEXT = "A swarm of volunteers serves a language model together. Ünïcödé ✓ works too."


def feed_all(assembler: TextAssembler, ids: list[int]) -> list[str]:
    deltas = []
    for token in ids:
        deltas.append(assembler.feed(token))
        if assembler.stopped:
            break
    deltas.append(assembler.flush())
    return deltas


def test_deltas_add_up_to_the_decoded_text(tokenizer):
    ids = tokenizer(TEXT).input_ids
    deltas = feed_all(TextAssembler(tokenizer, []), ids)
    assert "".join(deltas) == tokenizer.decode(ids)
    assert not any("\ufffd" in d for d in deltas)  # no half characters handed out


@pytest.mark.parametrize("stop", ["language", "a l", "Ü", "✓", "nowhere in the text"])
def test_text_ends_before_the_first_stop_string(tokenizer, stop):
    ids = tokenizer(TEXT).input_ids
    assembler = TextAssembler(tokenizer, [stop, "zzz"])
    text = "".join(feed_all(assembler, ids))
    full = tokenizer.decode(ids)
    assert text == (full[: full.index(stop)] if stop in full else full)
    assert assembler.stopped == (stop in full)


def test_a_possible_stop_prefix_is_held_back(tokenizer):
    assembler = TextAssembler(tokenizer, ["of vol"])
    sent = ""
    for token in tokenizer("A swarm of").input_ids:
        sent += assembler.feed(token)
    assert sent == "A swarm "  # "of" may start "of vol"; not sent yet


def test_requests_may_name_the_model_as_status_shows_it():
    from hexswarm.client.api.server import served_names

    assert served_names("smollm2-135m", "smollm2-135M-b83433b02745") == {
        "smollm2-135m",
        "smollm2-135M-b83433b02745",
        "smollm2-135M",
    }
    assert served_names("local", None) == {"local"}
