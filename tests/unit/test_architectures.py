"""Per-family settings read from configs and checkpoints (swarm/models/architectures.py), without processes."""

import pytest
import torch
from transformers import CONFIG_MAPPING, AutoModelForCausalLM

from hexswarm.peer.tp.shard import TPDegreeError, check_degree
from hexswarm.swarm.models import architectures
from hexswarm.swarm.models.checkpoint import load_tensors
from hexswarm.swarm.models.model_spec import ModelSpecError, config_for_blocks, load_model_spec

TP_FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text"]
NO_TP_FAMILIES = ["phi3", "mixtral", "qwen3_moe"]  # fused or packed projections, experts


@pytest.mark.parametrize("model_type", TP_FAMILIES)
def test_families_with_a_plain_tp_plan_split(model_type):
    check_degree(CONFIG_MAPPING[model_type](), 2)


@pytest.mark.parametrize("model_type", NO_TP_FAMILIES)
def test_families_without_one_refuse_tp_but_serve_whole_layers(model_type):
    config = CONFIG_MAPPING[model_type]()
    check_degree(config, 1)
    with pytest.raises(TPDegreeError, match=f"{model_type} cannot be split with --tp"):
        check_degree(config, 2)


def test_the_table_lists_each_family_once():
    assert set(TP_FAMILIES + NO_TP_FAMILIES) == set(architectures.SUPPORTED_FAMILIES)


def test_unsupported_architecture_names_itself_and_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "falcon", "architectures": ["FalconForCausalLM"]}')
    with pytest.raises(
        ModelSpecError, match=r"'falcon' \(FalconForCausalLM\) is not supported; supported: Llama"
    ):
        load_model_spec(tmp_path)


def test_moe_layers_are_renumbered_for_a_slice():
    config = CONFIG_MAPPING["qwen3_moe"](num_hidden_layers=6, mlp_only_layers=[1], decoder_sparse_step=2)
    # global rule: dense if listed or (i + 1) % 2 != 0 -> dense layers 0, 1, 2, 4
    local = config_for_blocks(config, 1, 5)
    assert (local.mlp_only_layers, local.decoder_sparse_step) == ([0, 1, 3], 1)


def test_layer_types_follow_the_config():
    assert (
        architectures.layer_types(CONFIG_MAPPING["mistral"](num_hidden_layers=2)) == ["sliding_attention"] * 2
    )
    assert architectures.layer_types(CONFIG_MAPPING["llama"](num_hidden_layers=2)) == ["full_attention"] * 2
    gemma = config_for_blocks(CONFIG_MAPPING["gemma2"](num_hidden_layers=4), 1, 3)
    assert architectures.layer_types(gemma) == ["full_attention", "sliding_attention"]


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_expert_tensors_are_fused_as_transformers_loads_them(make_model, arch):
    """Checkpoints hold one tensor per expert; the layer classes hold them stacked."""
    model_dir = make_model(arch=arch, layers=2, max_shard_size="100KB")
    spec = load_model_spec(model_dir)
    raw = load_tensors(spec.path, lambda name: name.startswith("model.layers.0."), torch.float32)
    converted = architectures.convert_checkpoint_tensors(spec.config, raw)
    reference = {
        name: t for name, t in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()
        if name.startswith("model.layers.0.")
    }  # fmt: skip
    assert converted.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(converted[name], tensor), name


def test_gemma_keeps_its_embedding_scale_and_caps_logits():
    config = CONFIG_MAPPING["gemma2"](hidden_size=64, final_logit_softcapping=3.0)
    logits = architectures.final_logits(config, torch.tensor([-100.0, 0.0, 100.0]))
    torch.testing.assert_close(logits, torch.tensor([-3.0, 0.0, 3.0]))
    with architectures.parameters_on_meta():
        embed = architectures.base_model_class(config)(config).embed_tokens
    assert embed.weight.is_meta and embed.embed_scale.item() == pytest.approx(8.0)
