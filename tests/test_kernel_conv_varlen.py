"""The varlen GDN conv kernel against causal_conv_ref, in place on a slot-indexed pool.

Without CUDA the kernels run under the interpreter (tests/conftest.py sets it), at tiny
shapes; the GPU test runs the 0.8B conv width and a 512-token prompt in bf16.
"""

from __future__ import annotations

import pytest
import torch

from resident.kernels.conv_varlen import (
    CONV_BLOCK_T,
    INTERPRETER_CONV_BLOCK_T,
    causal_conv_varlen,
)
from resident.kernels.gdn import causal_conv_ref, l2norm

NUM_SLOTS, WIDTH = 8, 4


def _step_meta(lengths: list[int], slots: list[int], device: str):
    qsl = torch.tensor([0, *lengths], device=device).cumsum(0)
    token_seq = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                        torch.tensor(lengths, device=device))
    return torch.tensor(slots, device=device), qsl, token_seq


def _check(lengths, slots, widths, head_dim, dtype, device, atol, l2norm_qk=False,
           block_t=None):
    """One varlen step of both; the rows' x is a strided view, as the model's split makes it.
    The kernel's query, key and value planes are the reference's columns, each contiguous;
    with l2norm_qk the query and key columns l2-normalised a head_dim-wide head at a time."""
    channels = sum(widths)
    generator = torch.Generator().manual_seed(sum(lengths))
    num_tokens = sum(lengths)
    wide = torch.randn(num_tokens, channels + 24, generator=generator).to(device, dtype)
    x = wide[:, 8:8 + channels]
    weight = torch.randn(channels, WIDTH, generator=generator).to(device, dtype)
    pool = torch.randn(NUM_SLOTS, channels, WIDTH, generator=generator).to(device, dtype)
    ref_pool = pool.clone()
    state_slots, qsl, token_seq = _step_meta(lengths, slots, device)
    planes = causal_conv_varlen(x, weight, pool, state_slots, qsl, token_seq, widths, head_dim,
                                l2norm_qk=l2norm_qk, block_t=block_t)
    want = list(causal_conv_ref(x, weight, ref_pool, state_slots, qsl, max(lengths))
                .split(widths, dim=-1))
    if l2norm_qk:
        want[:2] = [l2norm(t.unflatten(-1, (-1, head_dim))).flatten(-2) for t in want[:2]]
    for plane, columns in zip(planes, want, strict=True):
        assert plane.is_contiguous()
        torch.testing.assert_close(plane, columns, atol=atol, rtol=atol)
    torch.testing.assert_close(pool, ref_pool, atol=0, rtol=0)  # untouched slots too


# the GPU's tile (4 tokens a program) and the interpreter's default (16), which the CPU's engine
# tests run
TILES = [CONV_BLOCK_T, INTERPRETER_CONV_BLOCK_T]


@pytest.mark.parametrize("block_t", TILES)
@pytest.mark.parametrize("l2norm_qk", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_shorter_and_longer_than_the_window(dtype, l2norm_qk, block_t):
    # rows of 1 and 2 tokens take history from the pool; 11 and 5 straddle token blocks; heads
    # of 3 channels fill 3 of a program's 4 (the value plane's last program holds 2)
    _check([1, 11, 2, 5, 3], [5, 2, 7, 1, 6], widths=(6, 6, 8), head_dim=3, dtype=dtype,
           device="cpu", atol=1e-5 if dtype == torch.float32 else 1e-12, l2norm_qk=l2norm_qk,
           block_t=block_t)


@pytest.mark.parametrize("block_t", TILES)
@pytest.mark.parametrize("l2norm_qk", [False, True])
def test_one_long_row_over_several_channel_blocks(l2norm_qk, block_t):
    # 16-channel heads: 3 query and 3 key programs, and 104 value channels end 8 into the last;
    # 37 tokens: blocks inside the row past its window (the kernel's fast path) at either tile
    _check([37], [3], widths=(48, 48, 104), head_dim=16, dtype=torch.float32, device="cpu",
           atol=1e-5, l2norm_qk=l2norm_qk, block_t=block_t)


@pytest.mark.parametrize(("widths", "head_dim", "message"), [
    ((6, 7, 7), 3, "widths \\(6, 7, 7\\) are not \\(Kd, Kd, Vd\\) of 20 channels"),
    ((6, 6, 8), 4, "head_dim 4 does not divide the 6 key channels"),
])
def test_a_split_the_kernel_cannot_take_is_refused(widths, head_dim, message):
    x = torch.zeros(3, 20)
    state_slots, qsl, token_seq = _step_meta([3], [1], "cpu")
    with pytest.raises(ValueError, match=message):
        causal_conv_varlen(x, torch.zeros(20, WIDTH), torch.zeros(NUM_SLOTS, 20, WIDTH),
                           state_slots, qsl, token_seq, widths, head_dim)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("l2norm_qk", [False, True])
def test_prefill_shapes_bf16_gpu(l2norm_qk):
    # a 512-token prompt, a chunk continuing one, and decode rows of a mixed step
    _check([512, 100, 1, 1], [5, 2, 7, 1], widths=(2048, 2048, 2048), head_dim=128,
           dtype=torch.bfloat16, device="cuda", atol=2e-2, l2norm_qk=l2norm_qk)
