"""Gated DeltaNet decode steps (one new token per row) as Triton kernels, in place on the pools.

Drop-in replacements for `causal_conv_ref` and `gated_delta_rule_ref` (same signatures) when
`max_query_len == 1`: each row's state is read from its slot, advanced by one token and written
back where it lives, so a captured decode graph needs no gather/scatter around the op.

Both launches read only tensor metadata on the host (shapes, strides, dtypes): no host syncs, and
the grid is fixed by B and the shapes, so they can be captured in a CUDA graph once compiled (call
each once per dtype/stride layout before capturing). Rows must have distinct slots, except that
padding rows may share the sink slot 0: the conv steps them on the sink (garbage by design, those
rows race), the delta rule skips them (a padded step's decode entries are mostly padding, and
each would otherwise read and write a whole state; their outputs are left as `out` held them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resident.kernels import triton_compute_dtype

# Channels per conv program: 128 channels x W taps is one small contiguous pool tile, and enough
# programs per row (48 at C=6144) to spread a batch-1 step over the SMs. Wider programs in the
# wide buckets (fewer of them) were slower on an H100, the conv's µs a 0.8B step at 512 / 1,024
# channels a program from 32 rows up: c=64 97 -> 127 / 171, c=256 266 -> 294 / 413
# (results/2026-12-07-h100-conv-programs)
CONV_BLOCK_C = 128
CONV_NUM_WARPS = 4
# Value columns per delta-rule program. The program holds a [Dk, BLOCK_DV] fp32 state tile in
# registers: at Dk=128, 32 columns is 4096 floats, 32 registers a thread over 4 warps, well under
# Hopper's 255 per thread with room for the q/k/delta broadcasts; 4 programs per head also give
# 64 programs at batch 1. From WIDE_ROWS rows up a program takes WIDE_BLOCK_DV columns (the
# grid has programs to spare; ptxas spills ~100 bytes a thread at 64, tools/compile_check,
# and it is faster all the same): on an H100 at the 0.8B's heads a layer
# took 219.8 -> 200.1 µs at 256 rows with an fp32 state and 169.8 -> 116.1 with a bf16 one
# (gdn_state_dtype), 55.5 -> 52.8 and 30.2 -> 24.7 at 64 (tests/gpu/time_gdn_decode.py), and a
# c=256 step -5.6% and -16.3% (results/2026-12-06-h100-state-bf16). Below 64 rows, whole decode
# steps on an H100 (results/2026-12-06-h100-wide-rows) at 24 / 32 / 48 rows: +0.9 / -0.9 /
# -1.2% with an fp32 state, -3.1 / -3.8 / -3.1% with a bf16 one; so 64 columns from 32 rows,
# where neither state loses
GDN_BLOCK_DV = 32
WIDE_BLOCK_DV, WIDE_ROWS = 64, 32
GDN_NUM_WARPS = 4
L2NORM_EPS = 1e-6  # as `l2norm` in gdn.py: inside the rsqrt of the sum of squares
SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # torch's F.softplus: x itself above it


def block_dv_for(rows: int) -> int:
    """The delta rule's value columns a program for a launch of `rows` rows (GDN_BLOCK_DV)."""
    return WIDE_BLOCK_DV if rows >= WIDE_ROWS else GDN_BLOCK_DV


def _check_decode(max_query_len: int, rows: int, tokens: int) -> None:
    if max_query_len != 1:
        raise ValueError(f"decode kernels take max_query_len == 1, got {max_query_len=}")
    if rows != tokens:
        raise ValueError(f"decode needs one token per row: {tokens} tokens for {rows} state_slots")


@triton.jit
def _conv_decode_kernel(
    x_ptr, w_ptr, pool_ptr, slots_ptr, y_ptr,
    stride_xt, stride_xc, stride_wc, stride_ww,
    stride_pn, stride_pc, stride_pw, stride_yt, stride_yc,
    channels, width,
    BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr, COMPUTE: tl.constexpr,
):
    """One program: row `pid0`, channels [pid1 * BLOCK_C, +BLOCK_C), all W taps."""
    row = tl.program_id(0)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    offs_w = tl.arange(0, BLOCK_W)  # [BW]
    mask_c = offs_c < channels
    tile_mask = mask_c[:, None] & (offs_w < width)[None, :]  # [BC, BW]

    # The new window is the old one shifted left by one, with this row's input appended.
    pool = pool_ptr + slot * stride_pn + offs_c[:, None] * stride_pc  # [BC, 1]
    shift_mask = mask_c[:, None] & (offs_w + 1 < width)[None, :]
    older = tl.load(pool + (offs_w + 1)[None, :] * stride_pw, mask=shift_mask, other=0.0)
    x = tl.load(x_ptr + row * stride_xt + offs_c * stride_xc, mask=mask_c, other=0.0)  # [BC]
    # In x's dtype, as the reference concatenates the pool cast to x's dtype with x.
    window = tl.where((offs_w == width - 1)[None, :], x[:, None], older.to(x.dtype))  # [BC, BW]

    w = tl.load(w_ptr + offs_c[:, None] * stride_wc + offs_w[None, :] * stride_ww,
                mask=tile_mask, other=0.0)
    acc = tl.sum(window.to(COMPUTE) * w.to(COMPUTE), axis=1)  # [BC]
    y = acc / (1.0 + tl.exp(-acc))  # silu
    tl.store(y_ptr + row * stride_yt + offs_c * stride_yc, y.to(y_ptr.dtype.element_ty),
             mask=mask_c)
    # Every load of this program's pool tile is above, so overwriting it in place is safe; other
    # programs touch other channels or other slots (or the sink).
    tl.store(pool + offs_w[None, :] * stride_pw, window.to(pool_ptr.dtype.element_ty),
             mask=tile_mask)


def causal_conv_decode(
    x: torch.Tensor,  # [B, C]: each row's one new input
    weight: torch.Tensor,  # [C, W]
    conv_pool: torch.Tensor,  # [N, C, W]: each slot's last W inputs, oldest first; updated
    state_slots: torch.Tensor,  # [B] int64
    query_start_loc: torch.Tensor,  # [B+1]: unused (decode rows own one token each)
    max_query_len: int,
    *,
    out: torch.Tensor | None = None,  # [B, C] in x's dtype; allocated when None
) -> torch.Tensor:  # [B, C]
    """Depthwise causal conv + silu for one new token per row, `causal_conv_ref` for decode.

    Per row: window = (pool[slot][:, 1:], x[row]); y = silu(sum(window * weight, -1)); the window
    is written back to pool[slot] in place. Grid (B, cdiv(C, 128)).
    """
    del query_start_loc  # decode rows are tokens 0..B-1 in order
    _check_decode(max_query_len, state_slots.shape[0], x.shape[0])
    rows, channels = x.shape
    width = weight.shape[-1]
    y = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    grid = (rows, triton.cdiv(channels, CONV_BLOCK_C))
    _conv_decode_kernel[grid](
        x, weight, conv_pool, state_slots, y,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        conv_pool.stride(0), conv_pool.stride(1), conv_pool.stride(2), y.stride(0), y.stride(1),
        channels, width,
        BLOCK_C=CONV_BLOCK_C, BLOCK_W=triton.next_power_of_2(width),
        COMPUTE=triton_compute_dtype(weight.dtype), num_warps=CONV_NUM_WARPS,
    )
    return y


@triton.jit
def _gdn_decode_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr,
    stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd, stride_gt, stride_gh, stride_bt, stride_bh,
    stride_sn, stride_sh, stride_sk, stride_sv, stride_ot, stride_oh, stride_od,
    group, k_dim, v_dim, scale, eps,
    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, COMPUTE: tl.constexpr,
    RAW_GATES: tl.constexpr, L2NORM_QK: tl.constexpr,
):
    """One program: row `pid0`, value head `pid1`, value columns [pid2 * BLOCK_DV, +BLOCK_DV).
    A padding row (on the sink slot 0) does nothing: no state read or write, no output."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    if slot == 0:
        return
    k_head = head // group
    offs_k = tl.arange(0, BLOCK_DK)  # [BK]
    offs_v = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)  # [BV]
    mask_k = offs_k < k_dim
    mask_v = offs_v < v_dim

    # q, k: l2-normalised over the whole Dk (every program redoes this; it is Dk values).
    q = tl.load(q_ptr + row * stride_qt + k_head * stride_qh + offs_k * stride_qd,
                mask=mask_k, other=0.0).to(COMPUTE)
    k = tl.load(k_ptr + row * stride_kt + k_head * stride_kh + offs_k * stride_kd,
                mask=mask_k, other=0.0).to(COMPUTE)
    if L2NORM_QK:
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + eps)
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + eps)
    q = q * scale
    v = tl.load(v_ptr + row * stride_vt + head * stride_vh + offs_v * stride_vd,
                mask=mask_v, other=0.0).to(COMPUTE)  # [BV]
    g = tl.load(g_ptr + row * stride_gt + head * stride_gh).to(COMPUTE)
    b = tl.load(beta_ptr + row * stride_bt + head * stride_bh)
    if RAW_GATES:  # g holds a, b holds b: the gates as dense.gdn_gates computes them
        x = g + tl.load(dt_bias_ptr + head).to(COMPUTE)
        softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(x)))
        g = -tl.exp(tl.load(a_log_ptr + head).to(COMPUTE)) * softplus
        b = tl.sigmoid(b.to(COMPUTE)).to(b.dtype)  # rounded to b's dtype, as b.sigmoid() is
    b = b.to(COMPUTE)

    state_ptrs = (state_ptr + slot * stride_sn + head * stride_sh
                  + offs_k[:, None] * stride_sk + offs_v[None, :] * stride_sv)  # [BK, BV]
    tile_mask = mask_k[:, None] & mask_v[None, :]
    s = tl.load(state_ptrs, mask=tile_mask, other=0.0).to(COMPUTE) * tl.exp(g)
    delta = (v - tl.sum(s * k[:, None], axis=0)) * b  # [BV]
    s = s + k[:, None] * delta[None, :]
    o = tl.sum(s * q[:, None], axis=0)  # [BV]
    tl.store(state_ptrs, s.to(state_ptr.dtype.element_ty), mask=tile_mask)
    tl.store(out_ptr + row * stride_ot + head * stride_oh + offs_v * stride_od,
             o.to(out_ptr.dtype.element_ty), mask=mask_v)


def gated_delta_rule_decode(
    query: torch.Tensor,  # [B, Hk, Dk]
    key: torch.Tensor,  # [B, Hk, Dk]
    value: torch.Tensor,  # [B, Hv, Dv]
    log_decay: torch.Tensor,  # [B, Hv] fp32 (a, with gate_params)
    beta: torch.Tensor,  # [B, Hv] (b, with gate_params)
    state_pool: torch.Tensor,  # [N, Hv, Dk, Dv] gdn_state_dtype's (fp32, bf16, fp64); updated
    state_slots: torch.Tensor,  # [B] int64
    query_start_loc: torch.Tensor,  # [B+1]: unused (decode rows own one token each)
    max_query_len: int,
    *,
    out: torch.Tensor | None = None,  # [B, Hv, Dv] in value's dtype; allocated when None
    gate_params: tuple[torch.Tensor, torch.Tensor] | None = None,  # (A_log, dt_bias) [Hv]
    l2norm_qk: bool = True,  # False: query and key come l2-normed (conv_varlen's l2norm_qk)
    block_dv: int = 0,  # 0: block_dv_for(rows)
    num_warps: int = GDN_NUM_WARPS,
) -> torch.Tensor:  # [B, Hv, Dv]
    """One gated delta rule step per row, `gated_delta_rule_ref` for decode.

    With gate_params, log_decay and beta are the layer's raw projections a and b, and the
    kernel computes dense.gdn_gates itself (g = -exp(A_log) * softplus(a + dt_bias), beta =
    sigmoid(b)): the gates then cost no kernel of their own.

    Per row and value head h (key head h // (Hv // Hk)), q and k l2-normed (unless l2norm_qk is
    False: they come normed), q scaled by Dk**-0.5:
    S = state * exp(g); S += k (x) ((v - S^T k) * beta); out = S^T q; S written back to
    state_pool[slot, h] in place. Computed in fp32 (fp64 for a fp64 pool). A row on the sink
    slot 0 (padding) is skipped: no state read or written, its output left as `out` held it.
    Grid (B, Hv, cdiv(Dv, block_dv)); each program holds a [Dk, block_dv] tile of one head's
    state (tests/gpu/time_gdn_decode.py times other tiles and warps).
    """
    del query_start_loc  # decode rows are tokens 0..B-1 in order
    _check_decode(max_query_len, state_slots.shape[0], query.shape[0])
    rows, num_k_heads, k_dim = key.shape
    num_v_heads, v_dim = value.shape[1:]
    o = torch.empty_like(value, memory_format=torch.contiguous_format) if out is None else out
    block_dv = min(block_dv or block_dv_for(rows), triton.next_power_of_2(v_dim))
    grid = (rows, num_v_heads, triton.cdiv(v_dim, block_dv))
    a_log, dt_bias = gate_params if gate_params is not None else (log_decay, log_decay)
    _gdn_decode_kernel[grid](
        query, key, value, log_decay, beta, a_log, dt_bias, state_pool, state_slots, o,
        *query.stride(), *key.stride(), *value.stride(), *log_decay.stride(), *beta.stride(),
        *state_pool.stride(), *o.stride(),
        num_v_heads // num_k_heads, k_dim, v_dim, k_dim**-0.5, L2NORM_EPS,
        BLOCK_DK=triton.next_power_of_2(k_dim), BLOCK_DV=block_dv,
        COMPUTE=triton_compute_dtype(state_pool.dtype), RAW_GATES=gate_params is not None,
        L2NORM_QK=l2norm_qk, num_warps=num_warps,
    )
    return o
