"""conv_plane.py's kernel with the fast path for blocks inside one row, as the sweep ran it;
3539f0f shipped it (resident/kernels/conv_varlen.py), storing each plane with its own row
stride as an argument."""

import triton
import triton.language as tl


@triton.jit
def _conv_fast_kernel(
    x_ptr, w_ptr, pool_ptr, slots_ptr, qsl_ptr, seq_ptr, y_ptr,
    stride_xt, stride_xc, stride_wc, stride_ww, stride_pn, stride_pc, stride_pw,
    num_tokens, channels, key_width, head_dim, eps,
    WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr,
    L2NORM_QK: tl.constexpr,
):
    group = tl.program_id(1)
    first = tl.program_id(0) * BLOCK_T
    offs_t = first + tl.arange(0, BLOCK_T)  # [BT]
    offs_c = group * head_dim + tl.arange(0, BLOCK_C)  # [BC]
    mask_t = offs_t < num_tokens
    mask_c = (tl.arange(0, BLOCK_C) < head_dim) & (offs_c < channels)
    last = tl.minimum(first + BLOCK_T, num_tokens) - 1
    row_first = tl.load(seq_ptr + first)
    inner = (row_first == tl.load(seq_ptr + last)) & (
        first - tl.load(qsl_ptr + row_first) >= WIDTH - 1)
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=COMPUTE)
    if inner:
        for tap in tl.static_range(WIDTH):
            x = tl.load(x_ptr + (offs_t - (WIDTH - 1) + tap)[:, None] * stride_xt
                        + offs_c[None, :] * stride_xc, mask=mask_t[:, None] & mask_c[None, :],
                        other=0.0)
            weight = tl.load(w_ptr + offs_c * stride_wc + tap * stride_ww, mask=mask_c,
                             other=0.0)
            acc += x.to(COMPUTE) * weight.to(COMPUTE)[None, :]
    else:
        row = tl.load(seq_ptr + offs_t, mask=mask_t, other=0)
        row_start = tl.load(qsl_ptr + row, mask=mask_t, other=0)
        slot = tl.load(slots_ptr + row, mask=mask_t, other=0).to(tl.int64)
        index = offs_t - row_start
        for tap in tl.static_range(WIDTH):
            source = index - (WIDTH - 1) + tap
            from_x = mask_t & (source >= 0)
            from_pool = mask_t & (source < 0)
            x = tl.load(x_ptr + (row_start + source)[:, None] * stride_xt
                        + offs_c[None, :] * stride_xc,
                        mask=from_x[:, None] & mask_c[None, :], other=0.0)
            old = tl.load(pool_ptr + slot[:, None] * stride_pn + offs_c[None, :] * stride_pc
                          + (WIDTH + source)[:, None] * stride_pw,
                          mask=from_pool[:, None] & mask_c[None, :], other=0.0)
            value = tl.where(from_x[:, None], x, old.to(x.dtype))
            weight = tl.load(w_ptr + offs_c * stride_wc + tap * stride_ww, mask=mask_c,
                             other=0.0)
            acc += value.to(COMPUTE) * weight.to(COMPUTE)[None, :]
    y = acc / (1.0 + tl.exp(-acc))
    start = group * head_dim
    plane = (start >= key_width).to(tl.int64) + (start >= 2 * key_width).to(tl.int64)
    if L2NORM_QK and plane < 2:
        y = y * tl.rsqrt(tl.sum(y * y, axis=1) + eps)[:, None]
    width = tl.where(plane == 2, channels - 2 * key_width, key_width)
    place = y_ptr + plane * num_tokens * key_width + (start - plane * key_width) \
        + offs_t[:, None].to(tl.int64) * width + tl.arange(0, BLOCK_C)[None, :]
    tl.store(place, y.to(y_ptr.dtype.element_ty), mask=mask_t[:, None] & mask_c[None, :])
