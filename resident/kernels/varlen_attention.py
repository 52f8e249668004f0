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

Split keys (`num_splits` > 1, a third grid axis): a short step's grid is a few dozen programs,
each walking its row's whole context a tile at a time (a 256-token prefix hit over 1,280 keys:
34 programs of 80 tiles, 147 µs a layer on the H100, results/2026-12-05-h100-prefix-profile).
Split s of a query block takes its share of the block's key tiles, as the decode kernel's
splits do, and writes its rows' normalised output and log-sum-exp to scratch; the last split of
the block to arrive (gdc.last_to_arrive) merges them into `out`, so it is still one kernel.
`splits_for` picks the count from the grid and the SMs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from resident.interpreter import triton_interpreting
from resident.kernels import compute_dtype, dot_precision
from resident.kernels.decode_attention import _MIN_DOT, _softmax_step
from resident.kernels.gdc import KeptZeros, last_to_arrive

BLOCK_Q = 16  # query tokens a program
MAX_SPLITS = 8


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
    partial_out, partial_lse, counts,
    stride_pot, stride_poh, stride_pos, stride_pod, stride_lt, stride_lh, stride_ls,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, WHILE_LOOP: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    """NUM_SPLITS > 1: program (block, kv head, split) takes the split's share of the block's
    key tiles; partial_out [T, H, NUM_SPLITS, D] and partial_lse [T, H, NUM_SPLITS] (fp32) take
    its rows' normalised output and log2-sum-exp2, counts [blocks, Hkv] int32 (zero between
    launches) where the block's splits meet; the last to arrive merges them into out."""
    block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
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
    start = 0
    if NUM_SPLITS > 1:  # this split's share of the block's key tiles
        tiles_per_split = tl.cdiv(tl.cdiv(end, BLOCK_N), NUM_SPLITS)
        start = split * tiles_per_split * BLOCK_N
        end = tl.minimum(start + tiles_per_split * BLOCK_N, end)

    k_base = kv + kv_head * stride_kvh + offs_d[None, :] * stride_kvd  # [1, BLOCK_D]
    v_base = k_base + stride_kvplane
    table = block_tables + row.to(tl.int64) * stride_btb
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    tile = start
    if WHILE_LOOP:  # the interpreter cannot take a tensor as a range bound (decode_attention)
        while tile < end:
            m_i, l_i, acc = _causal_tile(q, k_base, v_base, table, stride_btw, stride_kvp,
                                         stride_kvs, qk_scale, tile, end, last, m_i, l_i, acc,
                                         d_mask, PAGE_SIZE, BLOCK_N, DOT_PRECISION)
            tile += BLOCK_N
    else:
        for tile in range(start, end, BLOCK_N):
            m_i, l_i, acc = _causal_tile(q, k_base, v_base, table, stride_btw, stride_kvp,
                                         stride_kvs, qk_scale, tile, end, last, m_i, l_i, acc,
                                         d_mask, PAGE_SIZE, BLOCK_N, DOT_PRECISION)
    out_ptrs = out + token[:, None] * stride_ot + heads[:, None] * stride_oh \
        + offs_d[None, :] * stride_od
    rows_mask = m_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        result = acc / l_i[:, None]  # every query row saw key 0, so l_i > 0
        tl.store(out_ptrs, result.to(out.dtype.element_ty), mask=rows_mask)
    else:
        # a split holding none of a row's keys (every score -inf: l_i 0, or NaN from the
        # online softmax's exp2(-inf - -inf)) gets lse = -inf, which the merge weighs by 0
        has_keys = l_i > 0
        normed = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        part = token[:, None] * stride_pot + heads[:, None] * stride_poh \
            + offs_d[None, :] * stride_pod
        at_lse = token * stride_lt + heads * stride_lh
        tl.store(partial_out + part + split * stride_pos, normed, mask=rows_mask)
        tl.store(partial_lse + at_lse + split * stride_ls, lse, mask=m_mask)
        count = counts + block * tl.num_programs(1) + kv_head
        if last_to_arrive(count, NUM_SPLITS):
            result = _merge_splits(partial_out + part, partial_lse + at_lse, stride_pos,
                                   stride_ls, rows_mask, m_mask, BLOCK_M, BLOCK_D, NUM_SPLITS)
            tl.store(out_ptrs, result.to(out.dtype.element_ty), mask=rows_mask)
            tl.store(count, 0)


@triton.jit
def _merge_splits(parts, lses, stride_pos, stride_ls, rows_mask, m_mask,
                  BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """[BLOCK_M, BLOCK_D]: the splits' normalised outputs (pointers `parts`, [BLOCK_M,
    BLOCK_D], and `lses`, [BLOCK_M], at split 0) weighed by exp2(lse), merged online. Loads
    past the L1 (.cg): other programs wrote them."""
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    merged = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        lse = tl.load(lses + s * stride_ls, mask=m_mask, other=float("-inf"),
                      cache_modifier=".cg")
        new_top = tl.maximum(top, lse)
        safe_top = tl.where(new_top == float("-inf"), 0.0, new_top)
        scale = tl.exp2(top - safe_top)  # 0 while nothing was seen: top = -inf
        weight = tl.exp2(lse - safe_top)  # 0 for a split with no keys
        part = tl.load(parts + s * stride_pos, mask=rows_mask, other=0.0, cache_modifier=".cg")
        part = tl.where(weight[:, None] > 0, part, 0.0)  # never 0 * (whatever scratch held)
        merged = merged * scale[:, None] + weight[:, None] * part
        total = total * scale + weight
        top = new_top
    return merged / tl.where(total > 0, total, 1.0)[:, None]


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
    num_splits: int = 1,
    meeting: KeptZeros | None = None,
) -> torch.Tensor:  # [T, H, D]
    """Causal attention of every row's new tokens over its pages: `paged_attention_ref`'s
    contract for rows given by query_start_loc. Tokens past qsl[B] (a padded step's tail) are
    left as `out` had them. Nothing is read on the host. num_splits > 1: each query block's
    keys split over that many programs (a compile-time constant), their scratch and counters
    kept in `meeting` (at addresses a captured graph holds; without one, made each call)."""
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
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits {num_splits} is not in 1..{MAX_SPLITS}")
    group = num_heads // num_kv_heads
    tile = tile_config(group, head_dim)
    if out is None:
        out = torch.empty_like(query)
    num_blocks = num_tokens // BLOCK_Q + num_rows
    if num_splits == 1:  # the scratch arguments are compiled out: stand-ins, no allocation
        scratch = (out, out, query_start_loc, *(0,) * 7)
    else:
        partial_out, partial_lse, counts = _split_scratch(
            meeting or KeptZeros(), num_tokens, num_heads, head_dim, num_blocks, num_kv_heads,
            num_splits, query)
        scratch = (partial_out, partial_lse, counts, *partial_out.stride(),
                   *partial_lse.stride())
    _varlen_kernel[(num_blocks, num_kv_heads, num_splits)](
        query, kv_layer, out, block_tables, query_start_loc, positions,
        scale * math.log2(math.e), num_rows,
        *query.stride(), *kv_layer.stride(), *block_tables.stride(), *out.stride(), *scratch,
        GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size, BLOCK_Q=BLOCK_Q,
        BLOCK_M=tile.block_m, BLOCK_D=tile.block_d, BLOCK_N=tile.block_n,
        DOT_PRECISION=dot_precision(kv_layer.dtype),
        WHILE_LOOP=triton_interpreting(), NUM_SPLITS=num_splits, num_warps=tile.num_warps,
        num_stages=2,
    )
    return out


def _split_scratch(meeting: KeptZeros, num_tokens: int, num_heads: int, head_dim: int,
                   num_blocks: int, num_kv_heads: int, num_splits: int,
                   query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(partial_out [T, H, S, D], partial_lse [T, H, S], counts [blocks, Hkv] int32) for a
    split launch, the partials fp32 (fp64 for a float64 query: the CPU parity dtype)."""
    shapes = ((num_tokens, num_heads, num_splits, head_dim),
              (num_tokens, num_heads, num_splits), (num_blocks, num_kv_heads))
    dtype = compute_dtype(query.dtype)
    return (meeting.get(shapes[0], dtype, query.device),
            meeting.get(shapes[1], dtype, query.device),
            meeting.get(shapes[2], torch.int32, query.device))


def splits_for(num_tokens: int, num_rows: int, num_kv_heads: int, num_sms: int) -> int:
    """Key splits a query block for a launch over num_tokens tokens in num_rows rows: the
    fewest whose grid covers every SM (one program an SM: 245-255 registers a thread at 8 warps
    at the 0.8B's head dim 256, tools/compile_check), at most MAX_SPLITS; one wherever the
    query blocks alone cover them.

    Rounded up, not down: a bucket's grid counts every row's block, and a padded step's rows
    are mostly padding whose programs return at once, so the grid's real work is smaller than
    its size. On the H200 (132 SMs, results/2026-12-06-h200-sampled-varlen) a 256-token hit
    over 1,024 keys (32 working programs) took 116 / 65 / 49 / 42 / 59 µs at 1 / 2 / 3 / 4 / 8
    splits, and beside 16 decode rows (64 working) 142 / 81 / 91 µs at 1 / 2 / 4: the engine's
    buckets for those steps (256 tokens and 8 rows; 512 tokens and 32 rows) give 3 and 2 splits
    rounded up, 2 and 1 rounded down. A 2,048-token prompt (256 working) takes 1 either way
    (296 / 291 / 296 µs at 1 / 2 / 4)."""
    programs = (num_tokens // BLOCK_Q + num_rows) * num_kv_heads
    return max(1, min(MAX_SPLITS, -(-num_sms // programs)))
