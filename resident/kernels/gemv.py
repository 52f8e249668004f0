"""Skinny GEMM for decode: y[M, N] = x[M, K] @ w[N, K]^T with M (the rows of a decode bucket) small.

At M = 1..16 a projection is a weight read: 2 N K bytes for 2 M N K flops. cuBLAS's kernels for
these shapes on the H200 move the 0.8B model's projection weights at about 1.4 TB/s (see
results/2026-11-29-h200-0.8b-backends), a third of the copy bandwidth. This kernel streams each
weight tile once through `tl.dot` (M padded to 16 rows, which costs nothing in a bandwidth-bound
loop) and splits K across programs when N alone gives too few of them to fill the GPU; the
partial sums go to an fp32 scratch that a second kernel adds up and casts.

Not on the step path yet: `python -m resident.kernels.bench_gemv` measures it against cuBLAS.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MIN_DOT = 16
TARGET_PROGRAMS = 264  # two waves of the H200's 132 SMs


@triton.jit
def _gemv_kernel(x, w, out, M, N, K, stride_xm, stride_wn, stride_om, stride_os,
                 K_TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K_TILES is a compile-time count: the interpreter cannot take a tensor as a range bound
    k_start = pid_k * (K_TILES * BLOCK_K)
    for tile in range(K_TILES):
        offs_k = k_start + tile * BLOCK_K + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x_tile = tl.load(x + offs_m[:, None] * stride_xm + offs_k[None, :],
                         mask=(offs_m[:, None] < M) & k_mask[None, :], other=0.0)
        w_tile = tl.load(w + offs_n[:, None] * stride_wn + offs_k[None, :],
                         mask=(offs_n[:, None] < N) & k_mask[None, :], other=0.0)
        acc += tl.dot(x_tile, tl.trans(w_tile))
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :],
             acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _sum_splits_kernel(partial, out, M, N, stride_ps, stride_pm, stride_om,
                       NUM_SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    m, n = offs // N, offs % N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in tl.static_range(NUM_SPLITS):
        acc += tl.load(partial + split * stride_ps + m * stride_pm + n, mask=mask, other=0.0)
    tl.store(out + m * stride_om + n, acc.to(out.dtype.element_ty), mask=mask)


def gemv_splits(n: int, k: int, block_n: int, block_k: int) -> int:
    """How many K splits bring the grid to about TARGET_PROGRAMS programs."""
    n_blocks = triton.cdiv(n, block_n)
    k_blocks = triton.cdiv(k, block_k)
    return max(1, min(k_blocks, triton.cdiv(TARGET_PROGRAMS, n_blocks)))


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, *, block_n: int = 32,
                  block_k: int = 256) -> torch.Tensor:
    """x [M, K] (M <= 16, rows contiguous in K) @ weight[N, K]^T -> [M, N] in x's dtype,
    accumulated in fp32."""
    num_rows, k = x.shape
    n = weight.shape[0]
    if num_rows > MIN_DOT:
        raise ValueError(f"skinny_linear takes at most {MIN_DOT} rows, got {num_rows}")
    if weight.shape[1] != k or x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} must share a "
                         f"contiguous K")
    out = torch.empty(num_rows, n, dtype=x.dtype, device=x.device)
    splits = gemv_splits(n, k, block_n, block_k)
    k_per_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)
    target = out if splits == 1 else torch.empty(splits, num_rows, n, dtype=torch.float32,
                                                 device=x.device)
    stride_split = 0 if splits == 1 else target.stride(0)
    stride_row = out.stride(0) if splits == 1 else target.stride(1)
    _gemv_kernel[(triton.cdiv(n, block_n), splits)](
        x, weight, target, num_rows, n, k, x.stride(0), weight.stride(0), stride_row,
        stride_split, K_TILES=k_per_split // block_k, BLOCK_M=MIN_DOT, BLOCK_N=block_n,
        BLOCK_K=block_k, num_warps=4, num_stages=3,
    )
    if splits > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(num_rows * n, block),)](
            target, out, num_rows, n, target.stride(0), target.stride(1), out.stride(0),
            NUM_SPLITS=splits, BLOCK=block, num_warps=4,
        )
    return out
