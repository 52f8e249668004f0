"""The fused attention prologue (q/k norm, partial RoPE, KV write) against the references it
replaces: dense.rope_tables + dense.qk_norm_rope + write_kv_ref."""

from __future__ import annotations

import pytest
import torch

from resident.kernels.attention import write_kv_ref
from resident.kernels.attention_prologue import AttentionHeads, attention_prologue
from resident.model.dense import qk_norm_rope, rope_tables

PAGE, NUM_PAGES = 4, 20  # 19 pages past the sink: 76 slots


def attention_prologue_ref(qkv, q_norm_weight, k_norm_weight, eps, positions, inv_freq,
                           kv_layer, kv_write_loc, heads: AttentionHeads) -> torch.Tensor:
    """The unfused path: dense.rope_tables and qk_norm_rope, then write_kv_ref."""
    num_tokens, dim = qkv.shape[0], heads.head_dim
    query_gate, key, value = qkv.split(heads.split, dim=-1)
    query = query_gate.view(num_tokens, heads.num_heads, 2 * dim)[..., :dim]
    cos, sin = rope_tables(positions, inv_freq, qkv.dtype)
    query, key = qk_norm_rope(query, key.view(num_tokens, heads.num_kv_heads, dim),
                              q_norm_weight, k_norm_weight, cos, sin, eps)
    write_kv_ref(kv_layer, key, value.view(num_tokens, heads.num_kv_heads, dim), kv_write_loc)
    return query


def _case(gen, heads: AttentionHeads, tokens: int, rotary: int, dtype, device):
    """Random inputs; each token writes its own slot in pages 1.. (page 0 is the sink)."""
    def randn(*size, scale=1.0):
        return (torch.randn(*size, generator=gen) * scale).to(device, dtype)

    qkv = randn(tokens, sum(heads.split))
    q_norm, k_norm = randn(heads.head_dim, scale=0.1), randn(heads.head_dim, scale=0.1)
    positions = torch.randint(0, 5000, (tokens,), generator=gen).to(device)
    exponent = torch.arange(0, rotary, 2, dtype=torch.float) / rotary
    inv_freq = (1.0 / (1e7**exponent)).to(device)
    if dtype == torch.float64:
        inv_freq = inv_freq.double()
    kv = randn(NUM_PAGES, 2, PAGE, heads.num_kv_heads, heads.head_dim)
    loc = torch.randperm((NUM_PAGES - 1) * PAGE, generator=gen)[:tokens].to(device) + PAGE
    return qkv, q_norm, k_norm, positions, inv_freq, kv, loc


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_the_prologue_matches_the_references(dtype, tolerance):
    gen = torch.Generator().manual_seed(3)
    heads = AttentionHeads(num_heads=4, num_kv_heads=2, head_dim=32)  # the tiny model's
    qkv, q_norm, k_norm, positions, inv_freq, kv, loc = _case(gen, heads, 5, 8, dtype, "cpu")
    ref_kv = kv.clone()
    query = attention_prologue(qkv, q_norm, k_norm, 1e-6, positions, inv_freq, kv, loc, heads)
    want = attention_prologue_ref(qkv, q_norm, k_norm, 1e-6, positions, inv_freq, ref_kv, loc,
                                  heads)
    assert query.shape == want.shape and query.is_contiguous()
    torch.testing.assert_close(query, want, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(kv, ref_kv, atol=tolerance, rtol=tolerance)
    pages, slots = loc // PAGE, loc % PAGE
    assert torch.equal(kv[pages, 1, slots], ref_kv[pages, 1, slots]), "values are a copy"
    written = torch.zeros(NUM_PAGES, PAGE, dtype=torch.bool)
    written[pages, slots] = True
    untouched = kv.transpose(1, 2)[~written]  # [slots, 2, Hkv, D]
    assert torch.equal(untouched, ref_kv.transpose(1, 2)[~written]), "a slot no token owns"


def test_a_qkv_of_other_heads_is_refused():
    gen = torch.Generator().manual_seed(4)
    heads = AttentionHeads(num_heads=4, num_kv_heads=2, head_dim=32)
    qkv, q_norm, k_norm, positions, inv_freq, kv, loc = _case(gen, heads, 2, 8, torch.float32,
                                                              "cpu")
    with pytest.raises(ValueError, match="not the contiguous output"):
        attention_prologue(qkv[:, 1:], q_norm, k_norm, 1e-6, positions, inv_freq, kv, loc,
                           heads)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [AttentionHeads(8, 2, 256), AttentionHeads(16, 4, 256)])
@pytest.mark.parametrize("tokens", [1, 64])
def test_the_prologue_matches_at_the_real_shapes(heads, tokens):
    gen = torch.Generator().manual_seed(tokens)
    case = _case(gen, heads, tokens, 64, torch.bfloat16, "cuda")
    qkv, q_norm, k_norm, positions, inv_freq, kv, loc = case
    ref_kv = kv.clone()
    for pdl in (False, True):
        query = attention_prologue(qkv, q_norm, k_norm, 1e-6, positions, inv_freq, kv, loc,
                                   heads, pdl=pdl)
        want = attention_prologue_ref(qkv, q_norm, k_norm, 1e-6, positions, inv_freq, ref_kv,
                                      loc, heads)
        torch.testing.assert_close(query, want, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(kv, ref_kv, atol=2e-2, rtol=2e-2)
