"""A decode block's opening residual add + RMSNorm as one Triton kernel that lets the next
kernel launch before it waits (dense.add_rms_norm's contract and numerics).

Under PDL every decode kernel releases the next one only after its own wait (pdl.py), so a
projection launches once the kernel two back has finished. After Inductor's add + norm that is
late for the wide projection behind it (GDN in_proj, attention qkv, MLP gate_up: 10-17 MB at
0.8B): it can start its weights for the L2 only while the short norm runs, and HBM idles through
the norm and the hand-offs around it. This kernel releases the next one before its wait, so the
projection launches while the narrow projection before the norm still runs (that one reads its
own weights from the L2, sent there before its wait) and streams its weights then; the
projection's own wait still orders it after the norm. What runs before this kernel's wait
reads nothing a kernel of the step writes (the norm's weight), and the projection after it
reads only its weights before its own wait, so the early release changes no result.

One program a row: x [M, N] (a finished projection) or [S, M, N] (a split-K projection's
partial sums in the compute dtype, added in split order and rounded, as add_rms_norm does),
the residual added in the compute dtype and rounded (the next residual stream), the rows normed
in the compute dtype, norm(x) * (1 + w), rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resident.kernels import compute_dtype, triton_compute_dtype
from resident.kernels.gdc import pdl_release_then_wait
from resident.kernels.pdl import launch_options


@triton.jit
def _add_rms_norm_kernel(x, residual, weight, normed, summed, N, stride_xs, stride_xm,
                         stride_rm, eps, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
                         COMPUTE: tl.constexpr, USE_PDL: tl.constexpr):
    """NUM_SPLITS 0: x is [M, N] in the activations' dtype; else its S = NUM_SPLITS partial
    sums [S, M, N] in COMPUTE. normed and summed are [M, N] with rows N apart."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    scale = 1.0 + tl.load(weight + cols, mask=mask, other=0.0).to(COMPUTE)
    pdl_release_then_wait(USE_PDL)
    dtype = summed.dtype.element_ty
    if NUM_SPLITS == 0:
        added = tl.load(x + row * stride_xm + cols, mask=mask, other=0.0)
    else:
        total = tl.zeros((BLOCK_N,), dtype=COMPUTE)
        for split in tl.static_range(NUM_SPLITS):
            total += tl.load(x + split * stride_xs + row * stride_xm + cols, mask=mask,
                             other=0.0)
        added = total.to(dtype)
    rest = tl.load(residual + row * stride_rm + cols, mask=mask, other=0.0)
    stream = (added.to(COMPUTE) + rest.to(COMPUTE)).to(dtype)
    tl.store(summed + row * N + cols, stream, mask=mask)
    values = stream.to(COMPUTE)
    rstd = tl.rsqrt(tl.sum(values * values, axis=0) / N + eps)
    tl.store(normed + row * N + cols, (values * rstd * scale).to(dtype), mask=mask)


def add_rms_norm(
    x: torch.Tensor,  # [M, N], or [S, M, N] split-K partial sums in compute_dtype
    residual: torch.Tensor,  # [M, N], rows contiguous
    weight: torch.Tensor,  # [N]
    eps: float,
    *,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # normed [M, N], summed [M, N]
    """dense.add_rms_norm in one kernel that, under pdl, releases the next kernel before it
    waits for the one before (see the module docstring)."""
    num_rows, n = residual.shape
    splits = x.shape[0] if x.dim() == 3 else 0
    partial_dtype = compute_dtype(residual.dtype)
    if x.shape[-2:] != (num_rows, n) or x.stride(-1) != 1 or residual.stride(1) != 1 \
            or weight.shape != (n,) or (splits and x.dtype != partial_dtype):
        raise ValueError(f"add_rms_norm takes x [M, N] or partials [S, M, N] in {partial_dtype}"
                         f", a residual [M, N] and a weight [N] with contiguous rows, got x "
                         f"{tuple(x.shape)} {x.dtype}, residual {tuple(residual.shape)}, "
                         f"weight {tuple(weight.shape)}")
    normed = torch.empty(num_rows, n, dtype=residual.dtype, device=residual.device)
    summed = torch.empty_like(normed)
    if num_rows:
        _add_rms_norm_kernel[(num_rows,)](
            x, residual, weight, normed, summed, n, x.stride(0) if splits else 0, x.stride(-2),
            residual.stride(0), eps, NUM_SPLITS=splits, BLOCK_N=triton.next_power_of_2(n),
            COMPUTE=triton_compute_dtype(residual.dtype), num_warps=4, **launch_options(pdl))
    return normed, summed
