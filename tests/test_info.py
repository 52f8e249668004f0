"""`resident info`: the numbers a serving engineer asks first, from the config alone."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from resident.cli import app
from resident.info import model_facts, parameter_count
from resident.model.config import load_model_config, shipped_model_names

runner = CliRunner()


def test_0_8b_facts():
    config = load_model_config("qwen3.5-0.8b")
    facts = model_facts(config)
    assert parameter_count(config) == 752_393_024  # transformers' count for these shapes
    assert facts.kv_bytes_per_token == 12 * 1024
    expected_ms = {1: 0.36, 16: 0.52, 64: 1.03, 256: 3.08}
    for row in facts.roofline:
        assert row.ms_per_step == pytest.approx(expected_ms[row.batch], abs=0.006)
        assert row.tokens_per_s == pytest.approx(row.batch / row.ms_per_step * 1e3)


def test_parameter_count_matches_transformers_for_an_untied_shape():
    transformers = pytest.importorskip("transformers")
    import torch

    config = load_model_config("qwen3.5-9b").replace(num_hidden_layers=4, vocab_size=1000)
    hf = transformers.Qwen3_5TextConfig(
        vocab_size=1000, hidden_size=4096, intermediate_size=12288, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=4, linear_num_key_heads=16,
        linear_num_value_heads=32, tie_word_embeddings=False,
    )
    with torch.device("meta"):
        reference = transformers.Qwen3_5ForCausalLM(hf)
    assert parameter_count(config) == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize("name", shipped_model_names())
def test_every_shipped_config_prints(name):
    result = runner.invoke(app, ["info", name, "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["model"]["model"] == name
    assert data["model"]["num_parameters"] == parameter_count(load_model_config(name))
    assert [row["batch"] for row in data["decode_roofline"]] == [1, 16, 64, 256]
    table = runner.invoke(app, ["info", name])
    assert table.exit_code == 0 and "decode roofline" in table.output


def test_context_and_bandwidth_move_the_roofline():
    base = json.loads(runner.invoke(app, ["info", "qwen3.5-0.8b", "--format", "json"]).output)
    longer = json.loads(runner.invoke(
        app, ["info", "qwen3.5-0.8b", "--context", "4096", "--bandwidth", "2.14",
              "--format", "json"]).output)
    assert longer["decode_roofline"][0]["ms_per_step"] > 2 * base["decode_roofline"][0][
        "ms_per_step"]


def test_a_bf16_gdn_state_halves_its_bytes_in_the_roofline():
    """--gdn-state-dtype bfloat16: each sequence's state and its share of a step's bytes
    halve (at 0.8B, c=256: 3.08 ms of floor at 4.28 TB/s becomes 1.95)."""
    def facts(*args):
        return json.loads(runner.invoke(app, ["info", "qwen3.5-0.8b", "--format", "json",
                                              *args]).output)

    fp32, bf16 = facts(), facts("--gdn-state-dtype", "bfloat16")
    state = fp32["model"]["gdn_recurrent_bytes_per_seq"]
    assert bf16["model"]["gdn_recurrent_bytes_per_seq"] * 2 == state
    for full, half in zip(fp32["decode_roofline"], bf16["decode_roofline"], strict=True):
        assert full["bytes_per_step"] - half["bytes_per_step"] == half["batch"] * state
    assert bf16["model"]["prefix_snapshots"] == fp32["model"]["prefix_snapshots"] == 64


@pytest.mark.parametrize(
    "args, message",
    [(["info", "no-such-model"], "unknown model 'no-such-model'"),
     (["info", "tiny", "--dtype", "int8"], "'int8' is not one of"),
     (["info", "tiny", "--gdn-state-dtype", "float16"], "'float16' is not one of"),
     (["info", "tiny", "--context", "-1"], "--context")],
)
def test_bad_input_is_named(args, message):
    result = runner.invoke(app, args, env={"COLUMNS": "300", "NO_COLOR": "1"})
    assert result.exit_code == 2
    assert message in result.output
