"""The token embedding of a decode step as one Triton gather: out[r] = weight[ids[r]].

torch's embedding (its indexSelectSmallIndex kernel) took a decode step's time in proportion
to the rows, as if it walked them one after another: 2.3 µs of an H100's c=1 step and 13.2 at
c=16, for 2 and 32 KB; this kernel, whose programs each copy one block of one row's columns at
once, 1.3 and 1.8 (results/2026-12-06-h100-exposed). Same contract as F.embedding(ids,
weight), ModelOps.embed's reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # a program's columns: the 0.8B's whole hidden row


@triton.jit
def _embed_kernel(weight, ids, out, hidden, stride_w, stride_o, BLOCK: tl.constexpr):
    row, block = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    token = tl.load(ids + row).to(tl.int64)
    values = tl.load(weight + token * stride_w + cols, mask=mask)
    tl.store(out + row * stride_o + cols, values, mask=mask)


def embedding(weight: torch.Tensor, ids: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """weight [V, H], ids [T] -> weight's rows [T, H], as one kernel of (row, block of columns)
    programs; block a power of two."""
    if ids.dim() != 1 or weight.stride(1) != 1:
        raise ValueError(f"embedding takes ids [T] and a weight with contiguous rows, got ids "
                         f"{tuple(ids.shape)} and strides {weight.stride()}")
    out = torch.empty(ids.shape[0], weight.shape[1], dtype=weight.dtype, device=weight.device)
    if ids.shape[0]:
        _embed_kernel[(ids.shape[0], triton.cdiv(weight.shape[1], block))](
            weight, ids, out, weight.shape[1], weight.stride(0), out.stride(0), BLOCK=block)
    return out
