"""A decode block's add + RMSNorm as one Triton kernel (kernels/add_norm.py) against
DenseOps.add_rms_norm, its reference (interpreter on CPU, at tiny sizes; at the 2B-9B widths on
a GPU)."""

from __future__ import annotations

import pytest
import torch

from resident.kernels.add_norm import add_rms_norm
from resident.model.dense import add_rms_norm as add_rms_norm_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(num_splits: int, num_rows: int, hidden: int, dtype: torch.dtype, seed: int = 0):
    """x ([T, H] in dtype, or [S, T, H] fp32 partials as a split-K projection leaves them),
    residual, a zero-centred norm weight."""
    generator = torch.Generator().manual_seed(seed)
    partial_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    shape = (num_splits, num_rows, hidden) if num_splits else (num_rows, hidden)
    x = torch.randn(shape, generator=generator).to(DEVICE, partial_dtype if num_splits else dtype)
    residual = (3 * torch.randn(num_rows, hidden, generator=generator)).to(DEVICE, dtype)
    weight = (0.1 * torch.randn(hidden, generator=generator)).to(DEVICE, dtype)
    return x, residual, weight


# bf16 on a GPU only (below): the interpreter casts to bf16 by truncation, not to nearest
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("num_splits", [0, 1, 3])  # 0: a finished [T, H] projection
@pytest.mark.parametrize("num_rows,hidden", [(1, 96), (3, 64)])  # a masked row; whole rows
def test_the_kernel_equals_the_dense_add_norm(dtype, num_splits, num_rows, hidden):
    x, residual, weight = _inputs(num_splits, num_rows, hidden, dtype)
    normed, summed = add_rms_norm(x, residual, weight, 1e-6)
    want_normed, want_summed = add_rms_norm_ref(x, residual, weight, 1e-6)
    # the sum is rounded once, as the reference rounds it: equal; the norm's sum of squares
    # is reduced in another order, so the normed rows may differ in their last place
    assert torch.equal(summed, want_summed)
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(normed, want_normed, atol=tolerance, rtol=tolerance)


def test_a_wrong_weight_or_split_moves_the_rows():
    """The comparison above can fail: a norm weight off by 1% in one column, or a split left
    out, is seen."""
    x, residual, weight = _inputs(3, 2, 64, torch.float64)
    normed, summed = add_rms_norm(x, residual, weight, 1e-6)
    off = weight.clone()
    off[5] += 0.01
    assert not torch.allclose(add_rms_norm(x, residual, off, 1e-6)[0], normed, atol=1e-6)
    assert not torch.allclose(add_rms_norm(x[:2], residual, weight, 1e-6)[1], summed, atol=1e-6)


def test_no_rows_and_bad_shapes_are_named():
    x, residual, weight = _inputs(0, 0, 64, torch.float32)
    assert add_rms_norm(x, residual, weight, 1e-6)[0].shape == (0, 64)
    x, residual, weight = _inputs(2, 2, 64, torch.float32)
    with pytest.raises(ValueError, match="contiguous residual"):
        add_rms_norm(x, residual[:, :32], weight, 1e-6)
    with pytest.raises(ValueError, match="contiguous rows"):
        add_rms_norm(x.transpose(1, 2), residual, weight, 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [2048, 2560, 4096])  # the 2B's, the 4B's, the 9B's
@pytest.mark.parametrize("num_rows,num_splits", [(1, 4), (16, 2), (256, 0)])
def test_the_kernel_equals_the_dense_add_norm_at_the_models_widths_gpu(hidden, num_rows,
                                                                        num_splits):
    x, residual, weight = _inputs(num_splits, num_rows, hidden, torch.bfloat16)
    normed, summed = add_rms_norm(x, residual, weight, 1e-6, pdl=True)
    want_normed, want_summed = add_rms_norm_ref(x, residual, weight, 1e-6)
    assert torch.equal(summed, want_summed)
    torch.testing.assert_close(normed, want_normed, atol=1e-2, rtol=1e-2)
