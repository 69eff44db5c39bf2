"""make-tiny-model: deterministic files, and a tokenizer that round-trips text."""

import hashlib

from transformers import AutoTokenizer

from hexswarm.swarm.commands.cli import main as hexswarm


def _digest(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_same_seed_same_files(tmp_path):
    args = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--seed", "3"]
    assert hexswarm(["make-tiny-model", str(tmp_path / "a"), *args]) == 0
    assert hexswarm(["make-tiny-model", str(tmp_path / "b"), *args]) == 0
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert hexswarm(["make-tiny-model", str(tmp_path / "c"), *args[:-1], "4"]) == 0
    assert _digest(tmp_path / "a")["model.safetensors"] != _digest(tmp_path / "c")["model.safetensors"]


def test_tokenizer_round_trips_any_text(make_model):
    tokenizer = AutoTokenizer.from_pretrained(make_model(arch="llama"))
    for text in ["A swarm of volunteers", "naïve ünïcödé ✓ 123", ""]:
        assert tokenizer.decode(tokenizer(text).input_ids) == text
