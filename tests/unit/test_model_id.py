"""Model ids hash the whole checkpoint, cached by file identity (swarm/models/model_id.py, swarm/models/content_hash.py).

Every checkpoint here is a real one written by save_pretrained (safetensors); the cache is a
real file in a temporary folder."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from hexswarm.swarm.models import content_hash
from hexswarm.swarm.models.model_id import ID_HASH_CHARS, size_label
from hexswarm.swarm.models.model_spec import ModelSpecError, load_model_spec, model_identity
from hexswarm.swarm.tools.cache_files import CACHE_ENV

WEIGHTS = "model.safetensors"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty model cache of this test's own."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


@pytest.fixture
def checkpoint(make_model, tmp_path) -> Path:
    """A private copy of a 2-block tiny llama (a 2 MB safetensors file) that a test may change."""
    return Path(shutil.copytree(make_model(arch="llama", layers=2), tmp_path / "checkpoint"))


@pytest.fixture
def hashes(monkeypatch) -> list[Path]:
    """The files read in full by content_hash, in order."""
    read: list[Path] = []
    real = content_hash.hash_file

    def counting(path, progress=None):
        read.append(Path(path))
        return real(path, progress)

    monkeypatch.setattr(content_hash, "hash_file", counting)
    return read


def flip_bit(path: Path, offset: int) -> None:
    """Changes one bit of one weight in place (the file keeps its size)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 1]))


def test_one_checkpoint_in_two_folders_has_one_id(cache, checkpoint, tmp_path):
    other = shutil.copytree(checkpoint, tmp_path / "a" / "renamed-elsewhere")
    first, second = model_identity(checkpoint)[0], model_identity(other)[0]
    assert first == second
    name, digest = first.rsplit("-", 1)
    assert name == "llama-500K" and len(digest) == ID_HASH_CHARS  # readable, from the content only
    assert load_model_spec(other).model_id == first  # the full spec says the same


def test_one_weight_changed_past_the_first_mib_is_another_model(cache, checkpoint, tmp_path):
    tuned = Path(
        shutil.copytree(checkpoint, tmp_path / "fine-tune" / checkpoint.name)
    )  # only content differs
    size = (tuned / WEIGHTS).stat().st_size
    assert size > 1 << 20  # so the change below lies beyond what the old id sampled
    flip_bit(tuned / WEIGHTS, size - 3)  # the last weight of the last tensor
    head = (1 << 20) + 64
    assert (tuned / WEIGHTS).read_bytes()[:head] == (checkpoint / WEIGHTS).read_bytes()[:head]
    assert model_identity(tuned)[0] != model_identity(checkpoint)[0]


def test_the_architecture_config_counts_and_who_saved_it_does_not(cache, checkpoint, tmp_path):
    base = model_identity(checkpoint)[0]
    config = json.loads((checkpoint / "config.json").read_text())
    resaved = Path(shutil.copytree(checkpoint, tmp_path / "resaved"))
    saver = {**config, "transformers_version": "9.9.9", "_name_or_path": "someone/else"}
    (resaved / "config.json").write_text(json.dumps(saver, indent=4))
    assert model_identity(resaved)[0] == base
    other_rope = Path(shutil.copytree(checkpoint, tmp_path / "rope"))
    (other_rope / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    assert model_identity(other_rope)[0] != base


def test_a_restart_reads_the_digests_from_the_cache_file(cache, checkpoint, hashes):
    first = model_identity(checkpoint)[0]
    assert hashes == [(checkpoint / WEIGHTS).resolve()]
    entries = json.loads((cache / content_hash.CACHE_FILE).read_text())["files"]
    assert list(entries) == [str((checkpoint / WEIGHTS).resolve())]
    # Nothing is kept in memory between calls: the second reads the cache file, as a restart does.
    assert model_identity(checkpoint)[0] == first
    assert len(hashes) == 1


def test_a_changed_file_is_hashed_again(cache, checkpoint, hashes):
    weights = checkpoint / WEIGHTS
    before = model_identity(checkpoint)[0]
    stat = weights.stat()
    flip_bit(weights, stat.st_size - 3)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert model_identity(checkpoint)[0] != before
    assert len(hashes) == 2


def test_a_file_replaced_under_its_old_size_and_mtime_is_hashed_again(cache, checkpoint, hashes):
    """A replacement that keeps size and mtime (a copy with `cp -p`, a rename over it) has a new inode."""
    weights = checkpoint / WEIGHTS
    before = model_identity(checkpoint)[0]
    replacement = checkpoint / "replacement.tmp"
    shutil.copyfile(weights, replacement)
    flip_bit(replacement, replacement.stat().st_size - 3)
    shutil.copystat(weights, replacement)
    os.replace(replacement, weights)
    assert model_identity(checkpoint)[0] != before
    assert len(hashes) == 2


def test_a_damaged_cache_file_costs_a_rehash_not_an_error(cache, checkpoint, hashes):
    before = model_identity(checkpoint)[0]
    entries = json.loads((cache / content_hash.CACHE_FILE).read_text())
    (entry,) = entries["files"].values()
    entry["digest"] = "not hex"
    (cache / content_hash.CACHE_FILE).write_text(json.dumps(entries))
    assert model_identity(checkpoint)[0] == before
    (cache / content_hash.CACHE_FILE).write_text("{ not json")
    assert model_identity(checkpoint)[0] == before
    assert len(hashes) == 3


def test_a_file_that_changes_while_hashed_is_refused(cache, checkpoint, monkeypatch):
    real = content_hash.hash_file

    def still_being_written(path, progress=None):
        digest = real(path, progress)
        with open(path, "ab") as f:
            f.write(b"\0")
        return digest

    monkeypatch.setattr(content_hash, "hash_file", still_being_written)
    with pytest.raises(ModelSpecError, match="changed while it was being hashed"):
        model_identity(checkpoint)
    assert not (cache / content_hash.CACHE_FILE).exists()


def test_a_sharded_checkpoint_hashes_every_shard_and_logs_progress(
    cache, make_model, tmp_path, hashes, monkeypatch, caplog
):
    sharded = Path(make_model(arch="qwen2", layers=2, max_shard_size="200KB"))
    shards = sorted(sharded.glob("*.safetensors"))
    assert len(shards) > 2
    monkeypatch.setattr(content_hash, "_PROGRESS_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger=content_hash.__name__):
        first = model_identity(sharded)[0]
    assert sorted(hashes) == [s.resolve() for s in shards]
    assert "hashing the weights once" in caplog.text and "hashed" in caplog.text
    copy = shutil.copytree(sharded, tmp_path / "sharded-copy")
    assert model_identity(copy)[0] == first
    flip_bit(Path(copy) / shards[-1].name, shards[-1].stat().st_size - 3)
    assert model_identity(copy)[0] != first


def test_a_folder_without_weights_is_refused(cache, checkpoint):
    (checkpoint / WEIGHTS).unlink()
    with pytest.raises(ModelSpecError, match="no \\*.safetensors weight files"):
        model_identity(checkpoint)


@pytest.mark.parametrize(
    ("parameters", "label"),
    [
        (950, "950"),
        (2_100, "2.1K"),
        (1_000_000, "1M"),
        (134_515_008, "135M"),
        (1_711_376_384, "1.7B"),
        (70_553_706_496, "71B"),
    ],
)
def test_size_labels_read_as_model_cards_write_them(parameters, label):
    assert size_label(parameters) == label
