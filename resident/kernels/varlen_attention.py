"""Causal paged attention over varlen rows (prefill and mixed steps) in Triton, with no host plan.

A step's rows bring any number of new tokens each (a decode row one, a prefill chunk many),
laid out row after row; token t of row b sees the row's keys 0..positions[t], which sit in the
row's pages (block_tables[b]) after the step's KV write. The grid depends only on the step's
token and row capacity, so a padded step's launch can be captured in a CUDA graph and replayed
with other rows in the same buffers:

  grid (T // BLOCK_Q + B, Hkv): program p is the p-th query block of the step, where row b's
  blocks are numbered from qsl[b] // BLOCK_Q + b (so that every row, however it is aligned,
  owns ceil(len / BLOCK_Q) numbers and no two rows share one). A program finds its row by a
  binary search over query_start_loc on the device, and returns at once when its number is past
  its row's blocks (the slack every row leaves, and zero-length padding rows).

One program takes BLOCK_Q tokens of one row and the `group` query heads that share a kv head,
as BLOCK_Q * group rows of one [M, D] tile (GQA packed into the MMA), and walks the row's keys
in tiles of BLOCK_N up to the block's last position, the causal mask per query row. The online
softmax is the decode kernel's (decode_attention._softmax_step). vLLM's Triton
"unified attention" kernel takes the same approach to the grid.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from resident.interpreter import triton_interpreting
from resident.kernels import dot_precision
from resident.kernels.decode_attention import _MIN_DOT, _softmax_step

BLOCK_Q = 16  # query tokens a program


@triton.jit
def _find_row(qsl, block, num_rows, BLOCK_Q: tl.constexpr):
    """The row whose query blocks hold global block number `block`: the last row b with
    qsl[b] // BLOCK_Q + b <= block."""
    low = 0
    high = num_rows
    while low < high:
        mid = (low + high) // 2
        first = tl.load(qsl + mid) // BLOCK_Q + mid
        if first <= block:
            low = mid + 1
        else:
            high = mid
    return low - 1


@triton.jit
def _varlen_kernel(
    query, kv, out, block_tables, qsl, positions, qk_scale, num_rows,
    stride_qt, stride_qh, stride_qd,
    stride_kvp, stride_kvplane, stride_kvs, stride_kvh, stride_kvd,
    stride_btb, stride_btw, stride_ot, stride_oh, stride_od,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, WHILE_LOOP: tl.constexpr,
):
    block = tl.program_id(0)
    kv_head = tl.program_id(1)
    row = _find_row(qsl, block, num_rows, BLOCK_Q)
    row_start = tl.load(qsl + row)
    local = block - (row_start // BLOCK_Q + row)  # this program's block within its row
    row_len = tl.load(qsl + row + 1) - row_start
    if local * BLOCK_Q >= row_len:
        return

    offs_m = tl.arange(0, BLOCK_M)  # query row m: token m // GROUP, head m % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    in_row = local * BLOCK_Q + offs_m // GROUP
    m_mask = (in_row < row_len) & (offs_m < BLOCK_Q * GROUP)
    d_mask = offs_d < HEAD_DIM
    token = (row_start + in_row).to(tl.int64)
    heads = kv_head * GROUP + offs_m % GROUP
    q = tl.load(query + token[:, None] * stride_qt + heads[:, None] * stride_qh
                + offs_d[None, :] * stride_qd, mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    q = q.to(kv.dtype.element_ty)
    # each query row sees keys 0..its position; masked rows see key 0 (never stored)
    last = tl.load(positions + token, mask=m_mask, other=0)  # [BLOCK_M]
    end = tl.max(last, 0) + 1

    k_base = kv + kv_head * stride_kvh + offs_d[None, :] * stride_kvd  # [1, BLOCK_D]
    v_base = k_base + stride_kvplane
    table = block_tables + row.to(tl.int64) * stride_btb
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    tile = 0
    if WHILE_LOOP:  # the interpreter cannot take a tensor as a range bound (decode_attention)
        while tile < end:
            m_i, l_i, acc = _causal_tile(q, k_base, v_base, table, stride_btw, stride_kvp,
                                         stride_kvs, qk_scale, tile, end, last, m_i, l_i, acc,
                                         d_mask, PAGE_SIZE, BLOCK_N, DOT_PRECISION)
            tile += BLOCK_N
    else:
        for tile in range(0, end, BLOCK_N):
            m_i, l_i, acc = _causal_tile(q, k_base, v_base, table, stride_btw, stride_kvp,
                                         stride_kvs, qk_scale, tile, end, last, m_i, l_i, acc,
                                         d_mask, PAGE_SIZE, BLOCK_N, DOT_PRECISION)
    result = acc / l_i[:, None]  # every query row saw key 0, so l_i > 0
    tl.store(out + token[:, None] * stride_ot + heads[:, None] * stride_oh
             + offs_d[None, :] * stride_od, result.to(out.dtype.element_ty),
             mask=m_mask[:, None] & d_mask[None, :])


@triton.jit
def _causal_tile(q, k_base, v_base, table, stride_btw, stride_kvp, stride_kvs, qk_scale,
                 tile, end, last, m_i, l_i, acc, d_mask,
                 PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Keys [tile, min(tile + BLOCK_N, end)), each query row masked to its keys 0..last[m]."""
    key = tile + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    loaded = key < end
    page = tl.load(table + (key // PAGE_SIZE) * stride_btw, mask=loaded, other=0)
    slot = page.to(tl.int64) * stride_kvp + (key % PAGE_SIZE) * stride_kvs
    kv_mask = loaded[:, None] & d_mask[None, :]
    k = tl.load(k_base + slot[:, None], mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
    v = tl.load(v_base + slot[:, None], mask=kv_mask, other=0.0)
    visible = key[None, :] <= last[:, None]  # [BLOCK_M, BLOCK_N]
    return _softmax_step(q, k, v, visible, qk_scale, m_i, l_i, acc, DOT_PRECISION)


class VarlenTile(NamedTuple):
    block_m: int  # query rows a program: BLOCK_Q tokens x the group's heads, padded
    block_d: int
    block_n: int  # keys a tile
    num_warps: int


def tile_config(group: int, head_dim: int) -> VarlenTile:
    """The launch's tile; checked with ptxas for sm_90 by tools/compile_check: at D = 256 and a
    group of 4, 16 keys a tile (one page) fit in registers with 8 warps and 32 spill."""
    block_m = max(triton.next_power_of_2(BLOCK_Q * group), _MIN_DOT)
    block_d = max(triton.next_power_of_2(head_dim), _MIN_DOT)
    return VarlenTile(block_m, block_d, 16 if block_d >= 256 else 64,
                      8 if block_m * block_d >= 16384 else 4)


def paged_varlen_attention(
    query: torch.Tensor,  # [T, H, D]
    kv_layer: torch.Tensor,  # [P, 2, S, Hkv, D]
    block_tables: torch.Tensor,  # [B, W] int32: row b's pages in order
    query_start_loc: torch.Tensor,  # [B+1]: row b's tokens are [qsl[b], qsl[b+1])
    positions: torch.Tensor,  # [T] int64: token t sees its row's keys 0..positions[t]
    scale: float,
    *,
    out: torch.Tensor | None = None,  # [T, H, D] in query's dtype
) -> torch.Tensor:  # [T, H, D]
    """Causal attention of every row's new tokens over its pages: `paged_attention_ref`'s
    contract for rows given by query_start_loc. Tokens past qsl[B] (a padded step's tail) are
    left as `out` had them. Nothing is read on the host."""
    num_tokens, num_heads, head_dim = query.shape
    _, planes, page_size, num_kv_heads, kv_dim = kv_layer.shape
    if planes != 2 or kv_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"kv_layer {tuple(kv_layer.shape)} does not fit query "
                         f"{tuple(query.shape)}")
    num_rows = query_start_loc.shape[0] - 1
    if block_tables.shape[0] != num_rows or positions.shape != (num_tokens,):
        raise ValueError(f"block_tables {tuple(block_tables.shape)} and positions "
                         f"{tuple(positions.shape)} do not fit {num_rows} rows, {num_tokens} "
                         f"tokens")
    group = num_heads // num_kv_heads
    tile = tile_config(group, head_dim)
    if out is None:
        out = torch.empty_like(query)
    grid = (num_tokens // BLOCK_Q + num_rows, num_kv_heads)
    _varlen_kernel[grid](
        query, kv_layer, out, block_tables, query_start_loc, positions,
        scale * math.log2(math.e), num_rows,
        *query.stride(), *kv_layer.stride(), *block_tables.stride(), *out.stride(),
        GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size, BLOCK_Q=BLOCK_Q,
        BLOCK_M=tile.block_m, BLOCK_D=tile.block_d, BLOCK_N=tile.block_n,
        DOT_PRECISION=dot_precision(kv_layer.dtype),
        WHILE_LOOP=triton_interpreting(), num_warps=tile.num_warps, num_stages=2,
    )
    return out
