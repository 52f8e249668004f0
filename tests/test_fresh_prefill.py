"""Fresh prefill buckets: the knobs, and the self-attention they run against the paged reference
(fp32 on CPU; bf16 at the 0.8B shapes on the GPU). The engine's padded prefill against the model
alone is in test_engine.py (references) and test_backends.py (the Triton conv); fla's
fixed-length GDN with padding is in tests/gpu/test_backends_gpu.py."""

from __future__ import annotations

import pytest
import torch

from resident.config import EngineConfig
from resident.kernels.attention import causal_self_attention, paged_attention_ref, write_kv_ref
from resident.model.config import load_model_config

TINY = load_model_config("tiny")
PAGE = 16


def test_prefill_buckets_resolve_by_device_and_budget():
    assert EngineConfig().resolve(TINY, "cpu").prefill_buckets == ()
    cuda = EngineConfig(prefill_token_budget=512).resolve(TINY, "cuda")
    assert (cuda.padded_prefill, cuda.prefill_buckets) == ("on", (64, 128, 256, 512))
    off = EngineConfig(padded_prefill="off").resolve(TINY, "cuda")
    assert off.prefill_buckets == ()
    assert EngineConfig(padded_prefill="on").resolve(TINY, "cpu").prefill_buckets[0] == 64


@pytest.mark.parametrize("buckets", [(64, 32), (0, 8), (8, 8)])
def test_bad_prefill_buckets_fail_naming_the_knob(buckets):
    with pytest.raises(ValueError, match="knob prefill_buckets: must be increasing"):
        EngineConfig(prefill_buckets=buckets)


def _fresh_row(num_tokens: int, heads: tuple[int, int, int], dtype, device, generator):
    """One fresh row's query, keys and values, and its keys written to random pages."""
    num_heads, num_kv_heads, head_dim = heads
    num_pages = -(-num_tokens // PAGE)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(device, dtype)

    query = randn(num_tokens, num_heads, head_dim)
    key, value = randn(num_tokens, num_kv_heads, head_dim), randn(num_tokens, num_kv_heads,
                                                                   head_dim)
    kv = randn(num_pages + 8, 2, PAGE, num_kv_heads, head_dim)  # stale pages around the row's
    pages = torch.randperm(num_pages + 7, generator=generator)[:num_pages].add(1).to(device)
    positions = torch.arange(num_tokens, device=device)
    write_kv_ref(kv, key, value, pages[positions // PAGE] * PAGE + positions % PAGE)
    return query, key, value, kv, pages[None].int(), positions


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")])])
@pytest.mark.parametrize("heads", [(8, 2, 256), (6, 3, 32), (4, 1, 16)])
def test_self_attention_matches_paged_reference(device, heads):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    generator = torch.Generator().manual_seed(heads[2])
    num_tokens = 37 if device == "cpu" else 513
    query, key, value, kv, tables, positions = _fresh_row(num_tokens, heads, dtype, device,
                                                          generator)
    scale = heads[2] ** -0.5
    want = paged_attention_ref(query, kv, tables, torch.zeros_like(positions), positions, scale)
    got = causal_self_attention(query, key, value, scale)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err < (1e-5 if dtype == torch.float32 else 1e-2)
