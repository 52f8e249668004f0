"""The varlen GDN conv kernel against causal_conv_ref, in place on a slot-indexed pool.

Without CUDA the kernels run under the interpreter (tests/conftest.py sets it), at tiny
shapes; the GPU test runs the 0.8B conv width and a 512-token prompt in bf16.
"""

from __future__ import annotations

import pytest
import torch

from resident.kernels.conv_varlen import causal_conv_varlen
from resident.kernels.gdn import causal_conv_ref

NUM_SLOTS, WIDTH = 8, 4


def _step_meta(lengths: list[int], slots: list[int], device: str):
    qsl = torch.tensor([0, *lengths], device=device).cumsum(0)
    token_seq = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                        torch.tensor(lengths, device=device))
    return torch.tensor(slots, device=device), qsl, token_seq


def _check(lengths, slots, channels, dtype, device, atol):
    """One varlen step of both; the rows' x is a strided view, as the model's split makes it."""
    generator = torch.Generator().manual_seed(sum(lengths))
    num_tokens = sum(lengths)
    wide = torch.randn(num_tokens, channels + 24, generator=generator).to(device, dtype)
    x = wide[:, 8:8 + channels]
    weight = torch.randn(channels, WIDTH, generator=generator).to(device, dtype)
    pool = torch.randn(NUM_SLOTS, channels, WIDTH, generator=generator).to(device, dtype)
    ref_pool = pool.clone()
    state_slots, qsl, token_seq = _step_meta(lengths, slots, device)
    y = causal_conv_varlen(x, weight, pool, state_slots, qsl, token_seq)
    want = causal_conv_ref(x, weight, ref_pool, state_slots, qsl, max(lengths))
    torch.testing.assert_close(y, want, atol=atol, rtol=atol)
    torch.testing.assert_close(pool, ref_pool, atol=0, rtol=0)  # untouched slots too


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_shorter_and_longer_than_the_window(dtype):
    # rows of 1 and 2 tokens take history from the pool; 11 and 5 straddle token blocks
    _check([1, 11, 2, 5, 3], [5, 2, 7, 1, 6], channels=20, dtype=dtype, device="cpu",
           atol=1e-5 if dtype == torch.float32 else 1e-12)


def test_one_long_row_over_several_channel_blocks():
    _check([37], [3], channels=200, dtype=torch.float32, device="cpu", atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefill_shapes_bf16_gpu():
    # a 512-token prompt, a chunk continuing one, and decode rows of a mixed step
    _check([512, 100, 1, 1], [5, 2, 7, 1], channels=6144, dtype=torch.bfloat16, device="cuda",
           atol=2e-2)
