"""The GDN causal conv over varlen rows (prefill and mixed steps), in place on the slot pool.

`causal_conv_ref` for any number of tokens per row, as two launches and no host work: fla's
`causal_conv1d` took a per-row gather of the initial states, a scatter of the final ones and
about 0.6 ms of host time per layer in its wrapper, on a prefill that is host-bound
(results/2026-11-29-h200-0.8b-fusions/profile/prefill_c16.txt).

- `_conv_varlen_kernel`, grid (cdiv(T, BLOCK_T), cdiv(C, Dk)): y[t] = silu(sum_j w[j] *
  v(i - (W-1) + j)) for token t, the row's i-th new token, where v(k) is the row's input k, or
  for k < 0 the pool's history pool[slot][W + k]. Reads the pool only. A program covers one
  Dk-wide group of channels: a query or key head, or Dk value channels, so every program writes
  one plane and a query or key head is l2-normalised over its Dk channels in the program (the
  delta rule ops paired with this conv take them normalised: fla's two l2norm kernels a GDN
  layer, 0.22 ms of a 2,048-token step at 0.8B, are gone). It writes y as three planes, query
  [T, Kd], key [T, Kd] and value [T, Vd] back to back, each contiguous: fla's chunked delta
  rule copies any input that is not (three copies a GDN layer when they were column slices of
  one [T, C] output).
- `_conv_state_kernel`, grid (B, cdiv(C, BLOCK_C)): pool[slot] = the last W entries of
  (pool[slot], the row's inputs); a row with no new token returns at once. It runs after the
  first launch in stream order, so no program of the first reads a window this one has
  overwritten; within it, each program reads its whole tile before it writes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resident.interpreter import triton_interpreting
from resident.kernels import triton_compute_dtype
from resident.kernels.gdn_decode import L2NORM_EPS

# [4 tokens, one 128-channel head] on 2 warps: at a 2,304-token step of the 0.8B the H200 ran
# this kernel (l2norm fused) in 40.8 us a call against 48.2 for the best tile of the kernel
# before it (no norm; fla's l2norm then added 2 x 4.0 us); graph-timed sweep of 4-32 tokens on
# 1-8 warps, results/2026-12-02-h200-0.8b-conv
CONV_BLOCK_T, CONV_NUM_WARPS = 4, 2
STATE_BLOCK_C = 64
# The interpreter runs a grid's programs one after another, each ~25 ms on the CPU whatever
# its tile, so there a program takes 16 tokens: a quarter of the programs (a padded CPU test
# spent half its time here). tests/test_kernel_conv_varlen.py runs both tiles.
INTERPRETER_CONV_BLOCK_T = 16


@triton.jit
def _conv_varlen_kernel(
    x_ptr, w_ptr, pool_ptr, slots_ptr, qsl_ptr, seq_ptr, y_ptr,
    stride_xt, stride_xc, stride_wc, stride_ww, stride_pn, stride_pc, stride_pw,
    num_tokens, channels, key_width, value_width, head_dim, eps,
    WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr,
    L2NORM_QK: tl.constexpr,
):
    group = tl.program_id(1)
    first = tl.program_id(0) * BLOCK_T
    offs_t = first + tl.arange(0, BLOCK_T)  # [BT]
    offs_c = group * head_dim + tl.arange(0, BLOCK_C)  # [BC]
    mask_t = offs_t < num_tokens
    mask_c = (tl.arange(0, BLOCK_C) < head_dim) & (offs_c < channels)
    row_first = tl.load(seq_ptr + first)
    last = tl.minimum(first + BLOCK_T, num_tokens) - 1
    # every token's window inside x: one row, past its first W-1 tokens (most blocks of a long
    # prompt). The general path's per-token row, start and slot loads and the pool's masked
    # gathers cost this kernel ~30% (59 against 41 us a call on the H200).
    inner = (row_first == tl.load(seq_ptr + last)) & (
        first - tl.load(qsl_ptr + row_first) >= WIDTH - 1)
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=COMPUTE)
    if inner:
        for tap in tl.static_range(WIDTH):
            x = tl.load(x_ptr + (offs_t - (WIDTH - 1) + tap)[:, None] * stride_xt
                        + offs_c[None, :] * stride_xc,
                        mask=mask_t[:, None] & mask_c[None, :], other=0.0)
            weight = tl.load(w_ptr + offs_c * stride_wc + tap * stride_ww, mask=mask_c,
                             other=0.0)
            acc += x.to(COMPUTE) * weight.to(COMPUTE)[None, :]
    else:
        row = tl.load(seq_ptr + offs_t, mask=mask_t, other=0)
        row_start = tl.load(qsl_ptr + row, mask=mask_t, other=0)
        slot = tl.load(slots_ptr + row, mask=mask_t, other=0).to(tl.int64)
        index = offs_t - row_start  # [BT]: the token's place in its row's new inputs
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
            weight = tl.load(w_ptr + offs_c * stride_wc + tap * stride_ww, mask=mask_c,
                             other=0.0)
            acc += value.to(COMPUTE) * weight.to(COMPUTE)[None, :]
    y = acc / (1.0 + tl.exp(-acc))  # silu
    # the group's plane: 0 query, 1 key (Kd wide each), 2 value; its first column in the plane
    start = group * head_dim
    plane = (start >= key_width).to(tl.int64) + (start >= 2 * key_width).to(tl.int64)
    if L2NORM_QK and plane < 2:
        y = y * tl.rsqrt(tl.sum(y * y, axis=1) + eps)[:, None]  # masked channels hold 0
    place = y_ptr + plane * num_tokens * key_width + (start - plane * key_width) \
        + tl.arange(0, BLOCK_C)[None, :]
    mask = mask_t[:, None] & mask_c[None, :]
    # a plane's row stride as an argument of its own (not a select of the two), so Triton
    # knows its divisibility and stores in vectors
    if plane == 2:
        tl.store(place + offs_t[:, None].to(tl.int64) * value_width,
                 y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(place + offs_t[:, None].to(tl.int64) * key_width,
                 y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _conv_state_kernel(
    x_ptr, pool_ptr, slots_ptr, qsl_ptr,
    stride_xt, stride_xc, stride_pn, stride_pc, stride_pw, channels,
    WIDTH: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    offs_w = tl.arange(0, BLOCK_W)  # [BW]
    mask_c = offs_c < channels
    start, end = tl.load(qsl_ptr + row), tl.load(qsl_ptr + row + 1)
    if end == start:  # no new input: the window stays (a padded step's padding rows)
        return
    slot = tl.load(slots_ptr + row).to(tl.int64)
    # entry w of the new window is entry (end - start) + w of (old window, new inputs)
    place = (end - start) + offs_w  # [BW]
    tile = mask_c[:, None] & (offs_w < WIDTH)[None, :]
    from_x = tile & (place >= WIDTH)[None, :]
    from_pool = tile & (place < WIDTH)[None, :]
    pool = pool_ptr + slot * stride_pn + offs_c[:, None] * stride_pc  # [BC, 1]
    x = tl.load(x_ptr + (start + place - WIDTH)[None, :] * stride_xt
                + offs_c[:, None] * stride_xc, mask=from_x, other=0.0)
    old = tl.load(pool + place[None, :] * stride_pw, mask=from_pool, other=0.0)
    window = tl.where(from_x, x.to(pool_ptr.dtype.element_ty), old)
    tl.store(pool + offs_w[None, :] * stride_pw, window, mask=tile)


def causal_conv_varlen(
    x: torch.Tensor,  # [T, C]: rows' new inputs, back to back (rows may be strided views)
    weight: torch.Tensor,  # [C, W]
    conv_pool: torch.Tensor,  # [N, C, W]: each slot's last W inputs, oldest first; updated
    state_slots: torch.Tensor,  # [B]
    query_start_loc: torch.Tensor,  # [B+1]: row b owns tokens [qsl[b], qsl[b+1])
    token_seq: torch.Tensor,  # [T]: each token's row
    widths: tuple[int, int, int],  # (Kd, Kd, Vd): query, key and value channels, C in all
    head_dim: int,  # Dk: the channels of a query or key head
    *,
    l2norm_qk: bool = False,
    block_t: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [T, Kd], [T, Kd], [T, Vd], contiguous
    """Depthwise causal conv + silu over each row's new tokens, the row's history from its
    pool slot; the slot then holds the row's last W inputs. No host reads or syncs. Returns
    the output split into query, key and value, each contiguous (module docstring); with
    l2norm_qk each query and key head l2-normalised over its Dk channels (as gdn.l2norm).
    block_t: tokens a program (a power of two); by default CONV_BLOCK_T, or
    INTERPRETER_CONV_BLOCK_T under the interpreter."""
    num_tokens, channels = x.shape
    width = weight.shape[-1]
    key_width, _, value_width = widths
    if widths[1] != key_width or 2 * key_width + value_width != channels:
        raise ValueError(f"widths {widths} are not (Kd, Kd, Vd) of {channels} channels")
    if head_dim <= 0 or key_width % head_dim:
        raise ValueError(f"head_dim {head_dim} does not divide the {key_width} key channels")
    if block_t is None:
        block_t = INTERPRETER_CONV_BLOCK_T if triton_interpreting() else CONV_BLOCK_T
    y = torch.empty(num_tokens * channels, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(num_tokens, block_t), triton.cdiv(channels, head_dim))
    _conv_varlen_kernel[grid](
        x, weight, conv_pool, state_slots, query_start_loc, token_seq, y,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), conv_pool.stride(0),
        conv_pool.stride(1), conv_pool.stride(2), num_tokens, channels, key_width, value_width,
        head_dim, L2NORM_EPS, WIDTH=width, BLOCK_T=block_t,
        BLOCK_C=triton.next_power_of_2(head_dim), COMPUTE=triton_compute_dtype(weight.dtype),
        L2NORM_QK=l2norm_qk, num_warps=CONV_NUM_WARPS,
    )
    _conv_state_kernel[(state_slots.shape[0], triton.cdiv(channels, STATE_BLOCK_C))](
        x, conv_pool, state_slots, query_start_loc, x.stride(0), x.stride(1),
        conv_pool.stride(0), conv_pool.stride(1), conv_pool.stride(2), channels,
        WIDTH=width, BLOCK_W=triton.next_power_of_2(width), BLOCK_C=STATE_BLOCK_C,
        num_warps=CONV_NUM_WARPS,
    )
    planes = y.split([num_tokens * key_width, num_tokens * key_width, num_tokens * value_width])
    return tuple(plane.view(num_tokens, -1) for plane in planes)
