"""The compiled dense ops (Inductor on CPU here): the numbers of the plain functions, and one
graph a function for every token count but one (a one-token batch is its own graph), even where
a token count equals a feature dim."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from resident.model.dense import DenseOps, build_dense_ops

HEAD_DIM, NUM_HEADS, HIDDEN, ROTARY = 16, 2, 32, 8


@pytest.fixture(scope="module")
def compiled() -> DenseOps:
    torch._dynamo.reset()
    return build_dense_ops(True)


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _attention_inputs(num_tokens: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    # query and gate are the two halves of one [T, H, 2D] projection, as in the model
    query_gate = torch.randn(num_tokens, NUM_HEADS, 2 * HEAD_DIM, generator=generator)
    query = query_gate[..., :HEAD_DIM]
    key = torch.randn(num_tokens, 1, HEAD_DIM, generator=generator)
    weights = torch.randn(2, HEAD_DIM, generator=generator) * 0.1
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, ROTARY, 2).float() / ROTARY))
    cos, sin = DenseOps().rope_tables(torch.arange(num_tokens), inv_freq, torch.float32)
    return query, key, weights[0], weights[1], cos, sin, 1e-6


def test_a_token_count_equal_to_the_head_dim_compiles_one_graph(compiled):
    plain = DenseOps()
    before = _graphs()
    for num_tokens in (HEAD_DIM, 12, 40):  # the first equals the head dim
        inputs = _attention_inputs(num_tokens, seed=num_tokens)
        for got, want in zip(compiled.qk_norm_rope(*inputs), plain.qk_norm_rope(*inputs),
                             strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert _graphs() - before == 1


def test_one_token_is_its_own_graph_and_the_rest_share_one(compiled):
    plain = DenseOps()
    before = _graphs()
    for num_tokens in (24, 7, 1, 64):
        gate_up = torch.randn(num_tokens, 2 * HIDDEN)
        torch.testing.assert_close(compiled.silu_mul(gate_up), plain.silu_mul(gate_up))
    assert _graphs() - before == 2


def test_split_k_partials_add_up_in_the_norm_for_every_token_count(compiled):
    plain = DenseOps()
    weight = torch.randn(HIDDEN) * 0.1
    before = _graphs()
    for num_tokens in (HIDDEN, 5, 48):  # the first equals the hidden size
        partials = torch.randn(3, num_tokens, HIDDEN)  # [S, T, H] fp32 split-K sums
        residual = torch.randn(num_tokens, HIDDEN)
        got = compiled.add_rms_norm(partials, residual, weight, 1e-6)
        want = plain.add_rms_norm(partials, residual, weight, 1e-6)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert _graphs() - before == 1
