"""A decode block's opening residual add + RMSNorm as one Triton kernel, one program a row.

Inductor compiles DenseOps.add_rms_norm into a persistent reduction (the row held in registers,
read once) only up to 1,024 columns (its `should_use_persistent_reduction` threshold); at the
2B's 2,048, the 4B's 2,560 and the 9B's 4,096 hidden columns it loops: a one-row decode step
runs a single program that walks the row twice, the second pass re-reading what the first
stored. On the H200 that took 2.6 µs exposed a call at the 9B (64 a step, 169 µs of a c=1
step), where the 0.8B's persistent kernel takes 1.2 (results/2026-12-07-h200-table). This
kernel holds a row whole at any of those widths and reads each input once: alone, in a
graph, 1.4-2.7 µs a one-row call at 2,048-4,096 columns against Inductor's 1.9-5.8 (H100).
The norm weight is loaded before the PDL wait (no kernel writes it); the next kernel is
released only once the rows are stored: released at the wait, the 2B's step was 4.8%
slower, released at the end 1.0% (results/2026-12-07-h100-add-norm, where the engine's use of
it, NORM_KERNEL_MIN_HIDDEN, was measured). Same contract and numerics as
DenseOps.add_rms_norm: x [T, H] or a narrow projection's fp32 split-K partials [S, T, H],
added up in split order and rounded as the finished projection would be.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resident.kernels import triton_compute_dtype
from resident.kernels.gdc import pdl_release, pdl_wait
from resident.kernels.pdl import launch_options


@triton.jit
def _add_norm_kernel(x, residual, norm_w, normed, summed, eps, N, stride_xs, stride_xm,
                     stride_r, stride_o, NUM_SPLITS: tl.constexpr, BLOCK: tl.constexpr,
                     COMPUTE: tl.constexpr, USE_PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    scale = 1.0 + tl.load(norm_w + cols, mask=mask, other=0.0).to(COMPUTE)
    pdl_wait(USE_PDL)
    dtype = summed.dtype.element_ty
    total = tl.load(x + row * stride_xm + cols, mask=mask, other=0.0).to(COMPUTE)
    for split in tl.static_range(1, NUM_SPLITS):
        total += tl.load(x + split * stride_xs + row * stride_xm + cols, mask=mask,
                         other=0.0).to(COMPUTE)
    # as torch adds two tensors of the activations' dtype: in fp32 (fp64), rounded once
    added = (total.to(dtype).to(COMPUTE)
             + tl.load(residual + row * stride_r + cols, mask=mask, other=0.0).to(COMPUTE))
    added = added.to(dtype)
    tl.store(summed + row * stride_o + cols, added, mask=mask)
    added = added.to(COMPUTE)
    rstd = tl.rsqrt(tl.sum(added * added, axis=0) / N + eps)
    tl.store(normed + row * stride_o + cols, (added * rstd * scale).to(dtype), mask=mask)
    pdl_release(USE_PDL)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 *, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), each [T, H] in residual's dtype: x is [T, H] or
    fp32 partials [S, T, H] (rows contiguous in H), residual [T, H] contiguous, weight [H]
    (zero-centred: the norm scales by 1 + w). pdl: launched with programmatic dependent
    launch (pdl.py)."""
    partials = x if x.dim() == 3 else x.unsqueeze(0)
    num_rows, hidden = residual.shape
    if (partials.shape[1:] != residual.shape or partials.stride(2) != 1
            or not residual.is_contiguous()):
        raise ValueError(f"add_rms_norm takes x [T, H] or [S, T, H] with contiguous rows and a "
                         f"contiguous residual [T, H], got x {tuple(x.shape)} strides "
                         f"{x.stride()}, residual {tuple(residual.shape)}")
    normed, summed = torch.empty_like(residual), torch.empty_like(residual)
    if num_rows:
        block = triton.next_power_of_2(hidden)
        _add_norm_kernel[(num_rows,)](
            partials, residual, weight, normed, summed, eps, hidden, partials.stride(0),
            partials.stride(1), residual.stride(0), normed.stride(0),
            NUM_SPLITS=partials.shape[0], BLOCK=block,
            COMPUTE=triton_compute_dtype(residual.dtype), num_warps=min(16, max(4, block // 256)),
            **launch_options(pdl))
    return normed, summed
