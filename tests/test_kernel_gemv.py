"""The skinny decode GEMM (Triton) against torch: the interpreter on CPU, bf16 on the GPU."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton or the kernel is imported

pytest.importorskip("triton")

from resident.kernels.gemv import (  # noqa: E402
    GemvTile,
    gemv_splits,
    skinny_linear,
    skinny_linear_partials,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("n, k, block_k", [(40, 300, 64), (70, 64, 64)])
def test_matches_torch_fp32(rows, n, k, block_k):
    generator = torch.Generator().manual_seed(rows * n)
    x = torch.randn(rows, k, generator=generator).to(DEVICE)
    weight = torch.randn(n + 5, k, generator=generator).to(DEVICE)[:n]  # a row-slice view
    got = skinny_linear(x, weight, GemvTile(block_n=16, block_k=block_k))
    torch.testing.assert_close(got, x @ weight.T, atol=1e-4, rtol=1e-4)


def test_splits_fill_the_grid_and_stop_at_k():
    assert gemv_splits(1024, 3584, GemvTile(32, 256)) == 9  # 32 column blocks, 14 K blocks
    assert gemv_splits(248320, 1024, GemvTile(32, 256)) == 1
    assert gemv_splits(16, 64, GemvTile(16, 64)) == 1  # one K block: nothing to split
    assert gemv_splits(1024, 3584, GemvTile(32, 256, target_programs=0)) == 1


def test_refuses_wide_batches():
    with pytest.raises(ValueError, match="at most 16 rows"):
        skinny_linear(torch.zeros(17, 8), torch.zeros(4, 8))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize("n, k", [(8224, 1024), (1024, 2048), (1024, 3584), (248320, 1024)])
def test_matches_torch_bf16_gpu(rows, n, k):
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    want = (x.float() @ weight.float().T)
    got = skinny_linear(x, weight).float()
    assert ((got - want).norm() / want.norm()).item() < 1e-2


@pytest.mark.parametrize("splits", [1, 3])
def test_partials_added_up_by_the_norm_match_the_finished_projection(splits):
    from resident.model.dense import add_rms_norm

    generator = torch.Generator().manual_seed(splits)
    x = torch.randn(2, 192, generator=generator).to(DEVICE)
    weight = torch.randn(48, 192, generator=generator).to(DEVICE)
    residual = torch.randn(2, 48, generator=generator).to(DEVICE)
    norm_weight = torch.randn(48, generator=generator).to(DEVICE)
    tile = GemvTile(block_n=16, block_k=64, target_programs=3 * splits)
    partials = skinny_linear_partials(x, weight, tile)
    assert partials.shape == (splits, 2, 48) and partials.dtype == torch.float32
    got = add_rms_norm(partials, residual, norm_weight, 1e-6)
    want = add_rms_norm(skinny_linear(x, weight, tile), residual, norm_weight, 1e-6)
    for got_part, want_part in zip(got, want, strict=True):
        torch.testing.assert_close(got_part, want_part, atol=1e-5, rtol=1e-5)


def test_tile_names_a_bad_value():
    with pytest.raises(ValueError, match="block_k must be a power of two"):
        GemvTile(block_k=96)
    with pytest.raises(ValueError, match="target_programs"):
        GemvTile(target_programs=-1)
