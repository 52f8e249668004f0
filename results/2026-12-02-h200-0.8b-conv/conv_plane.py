"""The varlen conv kernel as the sweep ran it (between 495afae and 3539f0f, never committed):
one Dk head a program, the plane uniform per program, l2norm of query and key fused. 3539f0f
shipped conv_fast.py's fast path on top of it instead."""

import triton
import triton.language as tl


@triton.jit
def _conv_varlen_kernel(
    x_ptr, w_ptr, pool_ptr, slots_ptr, qsl_ptr, seq_ptr, y_ptr,
    stride_xt, stride_xc, stride_wc, stride_ww, stride_pn, stride_pc, stride_pw,
    num_tokens, channels, key_width, head_dim, eps,
    WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr,
    L2NORM_QK: tl.constexpr,
):
    group = tl.program_id(1)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    offs_c = group * head_dim + tl.arange(0, BLOCK_C)  # [BC]
    mask_t = offs_t < num_tokens
    mask_c = (tl.arange(0, BLOCK_C) < head_dim) & (offs_c < channels)
    row = tl.load(seq_ptr + offs_t, mask=mask_t, other=0)
    row_start = tl.load(qsl_ptr + row, mask=mask_t, other=0)
    slot = tl.load(slots_ptr + row, mask=mask_t, other=0).to(tl.int64)
    index = offs_t - row_start  # [BT]: the token's place in its row's new inputs
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=COMPUTE)
    for tap in tl.static_range(WIDTH):
        source = index - (WIDTH - 1) + tap  # [BT]
        from_x = mask_t & (source >= 0)
        from_pool = mask_t & (source < 0)
        x = tl.load(x_ptr + (row_start + source)[:, None] * stride_xt
                    + offs_c[None, :] * stride_xc,
                    mask=from_x[:, None] & mask_c[None, :], other=0.0)
        old = tl.load(pool_ptr + slot[:, None] * stride_pn + offs_c[None, :] * stride_pc
                      + (WIDTH + source)[:, None] * stride_pw,
                      mask=from_pool[:, None] & mask_c[None, :], other=0.0)
        # in x's dtype, as the reference concatenates the pool cast to x's dtype with x
        value = tl.where(from_x[:, None], x, old.to(x.dtype))
        weight = tl.load(w_ptr + offs_c * stride_wc + tap * stride_ww, mask=mask_c, other=0.0)
        acc += value.to(COMPUTE) * weight.to(COMPUTE)[None, :]
    y = acc / (1.0 + tl.exp(-acc))  # silu
    # the group's plane: 0 query, 1 key (Kd wide each), 2 value; its first column in the plane
    start = group * head_dim
    plane = (start >= key_width).to(tl.int64) + (start >= 2 * key_width).to(tl.int64)
    if L2NORM_QK and plane < 2:
        y = y * tl.rsqrt(tl.sum(y * y, axis=1) + eps)[:, None]  # masked channels hold 0
    width = tl.where(plane == 2, channels - 2 * key_width, key_width)
    place = y_ptr + plane * num_tokens * key_width + (start - plane * key_width) \
        + offs_t[:, None].to(tl.int64) * width + tl.arange(0, BLOCK_C)[None, :]
    tl.store(place, y.to(y_ptr.dtype.element_ty), mask=mask_t[:, None] & mask_c[None, :])
