"""The decode block's opening add + norm as one Triton kernel (kernels/add_norm.py) against
dense.add_rms_norm, its reference (interpreter on CPU, at tiny sizes)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from resident.kernels import compute_dtype  # noqa: E402
from resident.kernels.add_norm import add_rms_norm  # noqa: E402
from resident.model import dense  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _operands(dtype: torch.dtype, rows: int, n: int, splits: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    shape = (splits, rows, n) if splits else (rows, n)
    x = torch.randn(*shape, generator=generator).to(DEVICE, compute_dtype(dtype) if splits
                                                       else dtype)
    residual = torch.randn(rows, n, generator=generator).to(DEVICE, dtype)
    weight = (0.1 * torch.randn(n, generator=generator)).to(DEVICE, dtype)
    return x, residual, weight


@pytest.mark.parametrize("splits", [0, 1, 3])  # a finished projection, then its partial sums
@pytest.mark.parametrize("rows, n", [(1, 64), (5, 40)])  # a whole row a block; a masked tail
def test_equals_dense_add_rms_norm_in_float64(splits, rows, n):
    x, residual, weight = _operands(torch.float64, rows, n, splits)
    normed, summed = add_rms_norm(x, residual, weight, 1e-6)
    want_normed, want_summed = dense.add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(summed, want_summed)
    torch.testing.assert_close(normed, want_normed, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("splits", [0, 4])
def test_bf16_within_a_rounding_and_the_stream_exact_on_the_gpu(splits):
    """The sum is elementwise and rounds as torch does: equal on the GPU (the interpreter
    truncates its bf16 conversions, so on the CPU within two bf16 steps: the partials' sum and
    the residual's each rounded). The norm's sum of squares adds in another order than torch's
    reduction: within a rounding of that."""
    x, residual, weight = _operands(torch.bfloat16, 3, 96, splits, seed=1)
    normed, summed = add_rms_norm(x, residual, weight, 1e-6)
    want_normed, want_summed = dense.add_rms_norm(x, residual, weight, 1e-6)
    if DEVICE == "cuda":
        assert torch.equal(summed, want_summed)
    torch.testing.assert_close(summed, want_summed, rtol=2**-6, atol=2**-6)
    torch.testing.assert_close(normed, want_normed, rtol=2**-5, atol=2**-5)


def test_no_rows_and_bad_operands_are_named():
    x, residual, weight = _operands(torch.float32, 0, 32, 0)
    normed, summed = add_rms_norm(x, residual, weight, 1e-6)
    assert normed.shape == summed.shape == (0, 32)
    x, residual, weight = _operands(torch.bfloat16, 2, 32, 2)
    with pytest.raises(ValueError, match="partials \\[S, M, N\\]"):
        add_rms_norm(x.to(torch.bfloat16), residual, weight, 1e-6)  # partials not in fp32
    with pytest.raises(ValueError, match="weight \\[N\\]"):
        add_rms_norm(x, residual, weight[:16], 1e-6)
