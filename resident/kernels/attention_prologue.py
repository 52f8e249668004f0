"""A gated attention layer's work between its qkv projection and its attention kernel, in one
kernel: each query and key head RMS-normed and partially rotated (RoPE), the query written out
for the attention kernel, the key and value written into their page slot of the KV cache.

Unfused, this is the rope tables, the compiled q/k norm + RoPE (Inductor: four kernels at the
0.8B) and the KV write: about six launches a layer for a few kilobytes. One program here takes
one token and one head (H query heads, then Hkv key heads, each key program also copying its
value head). The numerics follow the unfused path as Inductor runs it: the norm and the RoPE
tables rounded to the activations' dtype where the reference casts (dense.rms_norm,
dense.rope_tables), the rotation computed in fp32 and rounded once.

tests/test_kernel_attention_prologue.py checks it against the references it replaces.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resident.kernels import triton_compute_dtype
from resident.kernels.gdc import pdl_wait_then_release
from resident.kernels.layer_shapes import AttentionHeads
from resident.kernels.pdl import launch_options


def num_warps(head_dim: int) -> int:
    """A head's D values over one warp up to 128, two past it."""
    return 1 if head_dim <= 128 else 2


@triton.jit
def _attention_prologue_kernel(
    qkv_ptr, q_norm_ptr, k_norm_ptr, pos_ptr, inv_freq_ptr, kv_ptr, loc_ptr, query_ptr,
    stride_t, stride_qt, stride_qh, stride_page, stride_plane, stride_slot, stride_head,
    num_heads, num_kv_heads, eps,
    D: tl.constexpr, ROT: tl.constexpr, PAGE: tl.constexpr, COMPUTE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One program: token pid0, head pid1 (query heads first, then key heads)."""
    token, head = tl.program_id(0), tl.program_id(1)
    offs = tl.arange(0, D)
    half: tl.constexpr = ROT // 2
    partner = tl.where(offs < half, offs + half, tl.where(offs < ROT, offs - half, offs))
    pdl_wait_then_release(USE_PDL)
    row = qkv_ptr + token * stride_t
    is_query = head < num_heads
    kv_head = head - num_heads
    # a query head's D values open its 2D (query, gate) pair; key heads follow all the pairs,
    # then the value heads
    column = tl.where(is_query, head * 2 * D, num_heads * 2 * D + kv_head * D)
    q_weight = tl.load(q_norm_ptr + offs).to(COMPUTE)
    k_weight = tl.load(k_norm_ptr + offs).to(COMPUTE)
    q_mate_weight = tl.load(q_norm_ptr + partner).to(COMPUTE)
    k_mate_weight = tl.load(k_norm_ptr + partner).to(COMPUTE)
    x = tl.load(row + column + offs).to(COMPUTE)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    dtype = query_ptr.dtype.element_ty
    scale = 1.0 + tl.where(is_query, q_weight, k_weight)
    normed = (x * rstd * scale).to(dtype).to(COMPUTE)
    mate = tl.load(row + column + partner).to(COMPUTE)
    mate_scale = 1.0 + tl.where(is_query, q_mate_weight, k_mate_weight)
    mate = (mate * rstd * mate_scale).to(dtype).to(COMPUTE)
    freq_dtype = inv_freq_ptr.dtype.element_ty
    freq = (tl.load(pos_ptr + token).to(tl.float32).to(freq_dtype)
            * tl.load(inv_freq_ptr + offs % half, mask=offs < ROT, other=0.0))
    # precise sin / cos, as the reference's: their reduction of a large argument (libdevice's
    # Payne-Hanek path, |freq| above ~1e5) keeps a 28-byte local array, the 10 spill bytes the
    # launched kernel reports (compiled with its launch's hints on sm_90); below ~1e5 positions
    # the path is never taken
    cos = tl.cos(freq).to(dtype).to(COMPUTE)
    sin = tl.sin(freq).to(dtype).to(COMPUTE)
    sign = tl.where(offs < half, -1.0, 1.0).to(COMPUTE)
    out = tl.where(offs < ROT, normed * cos + sign * mate * sin, normed).to(dtype)
    if is_query:
        tl.store(query_ptr + token * stride_qt + head * stride_qh + offs, out)
    else:
        where = tl.load(loc_ptr + token)
        slot = (kv_ptr + (where // PAGE) * stride_page + (where % PAGE) * stride_slot
                + kv_head * stride_head)
        tl.store(slot + offs, out.to(kv_ptr.dtype.element_ty))
        value = tl.load(row + column + num_kv_heads * D + offs)
        tl.store(slot + stride_plane + offs, value.to(kv_ptr.dtype.element_ty))


def attention_prologue(
    qkv: torch.Tensor,  # [T, 2 H D + 2 Hkv D]: the qkv projection's output
    q_norm_weight: torch.Tensor,  # [D] (zero-centred)
    k_norm_weight: torch.Tensor,  # [D]
    eps: float,
    positions: torch.Tensor,  # [T] int64
    inv_freq: torch.Tensor,  # [R / 2]: RoPE on the first R dims of each head
    kv_layer: torch.Tensor,  # [P, 2, S, Hkv, D]; each token's key and value written
    kv_write_loc: torch.Tensor,  # [T] int64: page * S + offset
    heads: AttentionHeads,
    *,
    pdl: bool = False,
) -> torch.Tensor:  # [T, H, D]: the normed and rotated queries
    """q/k RMSNorm, partial RoPE and the KV write of one attention layer. Grid (T, H + Hkv)."""
    num_tokens, dim = qkv.shape[0], heads.head_dim
    rotary = 2 * inv_freq.shape[0]
    if qkv.shape[1] != sum(heads.split) or qkv.stride(1) != 1 or dim & (dim - 1):
        raise ValueError(f"qkv {tuple(qkv.shape)} (strides {qkv.stride()}) is not the "
                         f"contiguous output of a qkv projection of {heads}, power-of-two dims")
    if kv_layer.stride(4) != 1 or kv_layer.shape[3:] != (heads.num_kv_heads, dim):
        raise ValueError(f"kv_layer {tuple(kv_layer.shape)} must hold {heads.num_kv_heads} "
                         f"packed heads of {dim}")
    query = torch.empty(num_tokens, heads.num_heads, dim, dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return query
    _attention_prologue_kernel[(num_tokens, heads.num_heads + heads.num_kv_heads)](
        qkv, q_norm_weight, k_norm_weight, positions, inv_freq, kv_layer, kv_write_loc, query,
        qkv.stride(0), query.stride(0), query.stride(1), kv_layer.stride(0),
        kv_layer.stride(1), kv_layer.stride(2), kv_layer.stride(3), heads.num_heads,
        heads.num_kv_heads, eps,
        D=dim, ROT=rotary, PAGE=kv_layer.shape[2], COMPUTE=triton_compute_dtype(qkv.dtype),
        num_warps=num_warps(dim), **launch_options(pdl),
    )
    return query

