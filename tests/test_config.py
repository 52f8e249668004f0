"""ModelConfig validation: a bad shipped or user config fails naming the field."""

from __future__ import annotations

import pytest

from resident.model.config import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    configs_dir,
    load_model_config,
    shipped_model_names,
)


def test_shipped_configs_have_the_real_structure():
    assert shipped_model_names() == [
        "qwen3.5-0.8b", "qwen3.5-27b", "qwen3.5-2b", "qwen3.5-4b", "qwen3.5-9b", "tiny"]
    for name in shipped_model_names():
        config = load_model_config(name)
        assert config.weights == "random"
        for i, kind in enumerate(config.layer_types):
            assert kind == (FULL_ATTENTION if (i + 1) % 4 == 0 else LINEAR_ATTENTION)
        assert config.rotary_dim == config.head_dim // 4


def test_tiny_fits_the_gate_cells():
    tiny = load_model_config("tiny")
    assert tiny.vocab_size >= 512 and tiny.max_position_embeddings >= 2048
    assert tiny.tie_word_embeddings
    assert tiny.linear_num_value_heads > tiny.linear_num_key_heads
    assert tiny.num_attention_heads > tiny.num_key_value_heads


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 0}, "hidden_size must be a positive int"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
        ({"linear_num_key_heads": 3}, "not a multiple of linear_num_key_heads"),
        ({"partial_rotary_factor": 1.5}, "partial_rotary_factor must be in"),
        ({"head_dim": 36}, "rotary dims"),
        ({"layer_types": ("full_attention",) * 8 + ("mamba",)}, "layer_types has 9 entries"),
        ({"layer_types": ("mamba",) * 8}, "unknown layer type 'mamba'"),
        ({"weights": "/no/such/dir"}, "weights must be 'random' or a checkpoint directory"),
    ],
)
def test_bad_values_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        load_model_config("tiny").replace(**change)


def test_yaml_with_unknown_field(tmp_path):
    path = tmp_path / "odd.yaml"
    path.write_text((configs_dir() / "models" / "tiny.yaml").read_text() + "hiden_size: 3\n")
    with pytest.raises(ValueError, match="unknown model field 'hiden_size'"):
        load_model_config(str(path))
