"""The torch references' decode paths against their general varlen paths, and the paged
attention reference's bound on the pages it reads.

A decode step (max_query_len == 1) takes a path of its own in causal_conv_ref and
gated_delta_rule_ref; the same rows inside a step that also holds a longer row take the general
path. Both must give the same outputs and pools, bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from resident.kernels.attention import paged_attention_ref
from resident.kernels.gdn import causal_conv_ref, gated_delta_rule_ref

NUM_SLOTS, WIDTH = 10, 4
# decode rows (one with no token, as a varlen step may hold), in no slot order
DECODE_LENGTHS, DECODE_SLOTS = [1, 1, 0, 1, 1], [5, 2, 7, 0, 3]
LONG_LENGTH, LONG_SLOT = 6, 9  # the row that sends a step down the general path


def _qsl(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lengths]).cumsum(0)


def _mixed(x: torch.Tensor, long_x: torch.Tensor) -> torch.Tensor:
    """The decode rows' tokens, then the long row's."""
    return torch.cat([x, long_x])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conv_decode_path_equals_the_varlen_path(dtype):
    gen = torch.Generator().manual_seed(1)
    channels = 24

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    weight, pool = randn(channels, WIDTH), randn(NUM_SLOTS, channels, WIDTH)
    x, long_x = randn(sum(DECODE_LENGTHS), channels), randn(LONG_LENGTH, channels)
    decode_pool, mixed_pool = pool.clone(), pool.clone()

    y = causal_conv_ref(x, weight, decode_pool, torch.tensor(DECODE_SLOTS),
                        _qsl(DECODE_LENGTHS), 1)
    y_mixed = causal_conv_ref(_mixed(x, long_x), weight, mixed_pool,
                              torch.tensor([*DECODE_SLOTS, LONG_SLOT]),
                              _qsl([*DECODE_LENGTHS, LONG_LENGTH]), LONG_LENGTH)

    assert torch.equal(y, y_mixed[:len(x)])
    assert torch.equal(decode_pool[DECODE_SLOTS], mixed_pool[DECODE_SLOTS])
    untouched = [s for s in range(NUM_SLOTS) if s not in DECODE_SLOTS]
    assert torch.equal(decode_pool[untouched], pool[untouched])
    # the row without a token keeps its window; the others shift by their token
    empty = DECODE_SLOTS[DECODE_LENGTHS.index(0)]
    assert torch.equal(decode_pool[empty], pool[empty])
    rows = [s for s, n in zip(DECODE_SLOTS, DECODE_LENGTHS, strict=True) if n]
    assert torch.equal(decode_pool[rows, :, -1], x)
    assert torch.equal(decode_pool[rows, :, :-1], pool[rows, :, 1:])
    # and each token is the depthwise conv of its window
    window = torch.cat([pool[rows, :, 1:], x[:, :, None]], dim=2)
    want = F.silu(F.conv1d(window, weight[:, None, :], groups=channels))[:, :, 0]
    torch.testing.assert_close(y, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_delta_rule_decode_path_equals_the_varlen_path(dtype):
    gen = torch.Generator().manual_seed(2)
    hk, hv, dk, dv = 2, 4, 8, 6

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    def inputs(num_tokens: int) -> list[torch.Tensor]:
        return [randn(num_tokens, hk, dk), randn(num_tokens, hk, dk), randn(num_tokens, hv, dv),
                -torch.rand(num_tokens, hv, generator=gen),  # log decay, fp32
                torch.rand(num_tokens, hv, generator=gen).to(dtype)]

    pool = randn(NUM_SLOTS, hv, dk, dv)
    decode, long = inputs(sum(DECODE_LENGTHS)), inputs(LONG_LENGTH)
    decode_pool, mixed_pool = pool.clone(), pool.clone()

    out = gated_delta_rule_ref(*decode, decode_pool, torch.tensor(DECODE_SLOTS),
                               _qsl(DECODE_LENGTHS), 1)
    out_mixed = gated_delta_rule_ref(*map(_mixed, decode, long), mixed_pool,
                                     torch.tensor([*DECODE_SLOTS, LONG_SLOT]),
                                     _qsl([*DECODE_LENGTHS, LONG_LENGTH]), LONG_LENGTH)

    assert torch.equal(out, out_mixed[:len(decode[0])])
    assert torch.equal(decode_pool[DECODE_SLOTS], mixed_pool[DECODE_SLOTS])
    unchanged = [s for s, n in zip(DECODE_SLOTS, DECODE_LENGTHS, strict=True) if not n]
    unchanged += [s for s in range(NUM_SLOTS) if s not in DECODE_SLOTS]
    assert torch.equal(decode_pool[unchanged], pool[unchanged])
    advanced = [s for s, n in zip(DECODE_SLOTS, DECODE_LENGTHS, strict=True) if n]
    assert not torch.equal(decode_pool[advanced], pool[advanced])


def test_paged_attention_reads_no_page_past_the_furthest_position():
    """A block table wider than the rows hold, its extra columns on pages of NaN: the same
    output as the table cut to the pages the positions reach."""
    gen = torch.Generator().manual_seed(3)
    page, num_heads, num_kv_heads, head_dim = 4, 4, 2, 8
    kv = torch.randn(12, 2, page, num_kv_heads, head_dim, generator=gen, dtype=torch.float64)
    kv[10:] = float("nan")  # pages no row holds
    holds = torch.tensor([[1, 2, 3], [4, 5, 0], [6, 0, 0]], dtype=torch.int32)
    wide = torch.cat([holds, torch.tensor([[10, 11]] * 3, dtype=torch.int32)], dim=1)
    # a prefill chunk of row 0, one decode token each for rows 1 and 2
    token_seq = torch.tensor([0, 0, 0, 1, 2])
    positions = torch.tensor([8, 9, 10, 5, 2])
    query = torch.randn(5, num_heads, head_dim, generator=gen, dtype=torch.float64)

    got = paged_attention_ref(query, kv, wide, token_seq, positions, 0.3)
    want = paged_attention_ref(query, kv, holds, token_seq, positions, 0.3)
    assert not got.isnan().any()
    assert torch.equal(got, want)
    # more tokens than rows: the CPU gathers each row's keys once for its tokens; a token alone
    # gathers its own, and reads the same bits (a prefix hit's tokens as its fresh prefill's)
    for token in range(5):
        alone = paged_attention_ref(query[token:token + 1], kv, wide, token_seq[token:token + 1],
                                    positions[token:token + 1], 0.3)
        assert torch.equal(alone, got[token:token + 1])
