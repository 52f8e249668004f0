"""The model against transformers' Qwen3_5ForCausalLM, the reference nobody here wrote.

The checkpoint's shapes differ from `tiny` on every axis that a hard-coded size would hide:
head_dim 24 (rotary 6), more linear value heads than key heads, linear key dim != value dim,
untied embeddings. Norm weights, A_log and dt_bias are moved off their init first.
"""

from __future__ import annotations

import pytest
import torch

from resident.model.config import load_model_config
from resident.model.weights import load_model

from model_driver import ModelDriver

transformers = pytest.importorskip("transformers")

PAGE_SIZE = 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    config = transformers.Qwen3_5TextConfig(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, tie_word_embeddings=False,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    )
    torch.manual_seed(1234)
    reference = transformers.Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.3)
            elif name.endswith("A_log") or name.endswith("dt_bias"):
                param.add_(torch.randn_like(param) * 0.5)
    directory = tmp_path_factory.mktemp("qwen3_5_ckpt")
    reference.save_pretrained(directory)
    reference.config._attn_implementation = "eager"
    return directory, reference


@pytest.fixture(scope="module")
def ours(checkpoint):
    directory, _ = checkpoint
    return load_model(load_model_config(str(directory)), "cpu", torch.float32)


def reference_logits(reference, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return reference(torch.tensor([tokens])).logits[0]


def prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 320, (n,), generator=generator).tolist() for n in lengths]


def test_config_reads_the_checkpoint(ours):
    config = ours.config
    assert (config.head_dim, config.rotary_dim) == (24, 6)
    assert (config.linear_num_key_heads, config.linear_num_value_heads) == (2, 4)
    assert (config.linear_key_head_dim, config.linear_value_head_dim) == (16, 8)
    assert not config.tie_word_embeddings and config.rope_theta == 1e7
    assert config.attention_layers == (3, 7)


def test_prefill_logits_batch_of_three(checkpoint, ours):
    _, reference = checkpoint
    batch = prompts(0, [7, 45, 16])  # 45 tokens span three pages
    driver = ModelDriver(ours, page_size=PAGE_SIZE)
    got = driver.step({f"p{i}": p for i, p in enumerate(batch)})
    for i, prompt in enumerate(batch):
        expected = reference_logits(reference, prompt)
        diff = (got[f"p{i}"] - expected).abs().max().item()
        print(f"prompt {i} ({len(prompt)} tokens): prefill max abs logit diff {diff:.2e}")
        torch.testing.assert_close(got[f"p{i}"], expected, atol=2e-4, rtol=1e-4)


def test_greedy_decode_ten_steps(checkpoint, ours):
    _, reference = checkpoint
    batch = prompts(1, [12, 30])
    driver = ModelDriver(ours, page_size=PAGE_SIZE)
    logits = driver.step({f"p{i}": p for i, p in enumerate(batch)})
    sequences = {f"p{i}": list(p) for i, p in enumerate(batch)}
    worst = 0.0
    for _ in range(10):
        next_tokens = {name: int(out[-1].argmax()) for name, out in logits.items()}
        for name, seq in sequences.items():
            expected = reference_logits(reference, seq)[-1]
            worst = max(worst, (logits[name][-1] - expected).abs().max().item())
            assert next_tokens[name] == int(expected.argmax())
            seq.append(next_tokens[name])
        logits = driver.step({name: [tok] for name, tok in next_tokens.items()})
    print(f"10 greedy decode steps: max abs logit diff {worst:.2e}")
    assert worst < 2e-4


def test_mixed_step_equals_running_apart(ours):
    long_prompt, short_a, short_b = prompts(2, [40, 9, 21])
    apart = ModelDriver(ours, page_size=PAGE_SIZE)
    apart.step({"a": short_a, "b": short_b})
    decode_apart = apart.step({"a": [5], "b": [6]})
    prefill_apart = ModelDriver(ours, page_size=PAGE_SIZE).step({"long": long_prompt})

    mixed = ModelDriver(ours, page_size=PAGE_SIZE)
    mixed.step({"a": short_a, "b": short_b})
    together = mixed.step({"long": long_prompt, "a": [5], "b": [6]})
    torch.testing.assert_close(together["long"], prefill_apart["long"], atol=1e-5, rtol=1e-5)
    for name in ("a", "b"):
        torch.testing.assert_close(together[name], decode_apart[name], atol=1e-5, rtol=1e-5)


def test_two_chunks_equal_one(ours):
    (prompt,) = prompts(3, [37])
    whole = ModelDriver(ours, page_size=PAGE_SIZE).step({"p": prompt})["p"]
    chunked = ModelDriver(ours, page_size=PAGE_SIZE)
    first = chunked.step({"p": prompt[:19]})["p"]  # the split falls inside a page
    second = chunked.step({"p": prompt[19:]})["p"]
    torch.testing.assert_close(torch.cat([first, second]), whole, atol=1e-5, rtol=1e-5)
