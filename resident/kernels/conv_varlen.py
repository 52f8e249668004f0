"""The GDN causal conv over varlen rows (prefill and mixed steps), in place on the slot pool.

`causal_conv_ref` for any number of tokens per row, as two launches and no host work: fla's
`causal_conv1d` took a per-row gather of the initial states, a scatter of the final ones and
about 0.6 ms of host time per layer in its wrapper, on a prefill that is host-bound
(results/2026-11-29-h200-0.8b-fusions/profile/prefill_c16.txt).

- `_conv_varlen_kernel`, grid (cdiv(T, BLOCK_T), cdiv(C, BLOCK_C)): y[t] = silu(sum_j w[j] *
  v(i - (W-1) + j)) for token t, the row's i-th new token, where v(k) is the row's input k, or
  for k < 0 the pool's history pool[slot][W + k]. Reads the pool only. It writes y as three
  planes, query [T, Kd], key [T, Kd] and value [T, Vd] back to back, each contiguous: fla's
  chunked delta rule copies any input that is not (three copies a GDN layer, 54 kernels of a
  2,048-token step at 0.8B, when they were column slices of one [T, C] output).
- `_conv_state_kernel`, grid (B, cdiv(C, BLOCK_C)): pool[slot] = the last W entries of
  (pool[slot], the row's inputs); a row with no new token returns at once. It runs after the
  first launch in stream order, so no program of the first reads a window this one has
  overwritten; within it, each program reads its whole tile before it writes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resident.kernels.gdn_decode import compute_dtype

# [8, 64] tiles on 2 warps: at 2,304 tokens x 6,144 channels (0.8B) the H200 ran the conv in
# 54 us against 68 for [16, 128] on 4 warps, the best of 36 tiles timed
CONV_BLOCK_T, CONV_BLOCK_C, CONV_NUM_WARPS = 8, 64, 2


@triton.jit
def _conv_varlen_kernel(
    x_ptr, w_ptr, pool_ptr, slots_ptr, qsl_ptr, seq_ptr, y_ptr,
    stride_xt, stride_xc, stride_wc, stride_ww, stride_pn, stride_pc, stride_pw,
    num_tokens, channels, key_width,
    WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, COMPUTE: tl.constexpr,
):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT]
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)  # [BC]
    mask_t, mask_c = offs_t < num_tokens, offs_c < channels
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
    # channel c is column c - plane * Kd of plane 0 (query), 1 (key) or 2 (value, Vd wide)
    plane = (offs_c >= key_width).to(tl.int64) + (offs_c >= 2 * key_width).to(tl.int64)  # [BC]
    width = tl.where(plane == 2, channels - 2 * key_width, key_width)
    place = (plane * num_tokens * key_width + offs_c - plane * key_width)[None, :] \
        + offs_t[:, None].to(tl.int64) * width[None, :]
    tl.store(y_ptr + place, y.to(y_ptr.dtype.element_ty),
             mask=mask_t[:, None] & mask_c[None, :])


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [T, Kd], [T, Kd], [T, Vd], contiguous
    """Depthwise causal conv + silu over each row's new tokens, the row's history from its
    pool slot; the slot then holds the row's last W inputs. No host reads or syncs. Returns
    the output split into query, key and value, each contiguous (module docstring)."""
    num_tokens, channels = x.shape
    width = weight.shape[-1]
    key_width, _, value_width = widths
    if widths[1] != key_width or 2 * key_width + value_width != channels:
        raise ValueError(f"widths {widths} are not (Kd, Kd, Vd) of {channels} channels")
    y = torch.empty(num_tokens * channels, dtype=x.dtype, device=x.device)
    blocks_c = triton.cdiv(channels, CONV_BLOCK_C)
    _conv_varlen_kernel[(triton.cdiv(num_tokens, CONV_BLOCK_T), blocks_c)](
        x, weight, conv_pool, state_slots, query_start_loc, token_seq, y,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), conv_pool.stride(0),
        conv_pool.stride(1), conv_pool.stride(2), num_tokens, channels, key_width,
        WIDTH=width, BLOCK_T=CONV_BLOCK_T, BLOCK_C=CONV_BLOCK_C,
        COMPUTE=compute_dtype(weight.dtype), num_warps=CONV_NUM_WARPS,
    )
    _conv_state_kernel[(state_slots.shape[0], blocks_c)](
        x, conv_pool, state_slots, query_start_loc, x.stride(0), x.stride(1),
        conv_pool.stride(0), conv_pool.stride(1), conv_pool.stride(2), channels,
        WIDTH=width, BLOCK_W=triton.next_power_of_2(width), BLOCK_C=CONV_BLOCK_C,
        num_warps=CONV_NUM_WARPS,
    )
    planes = y.split([num_tokens * key_width, num_tokens * key_width, num_tokens * value_width])
    return tuple(plane.view(num_tokens, -1) for plane in planes)
