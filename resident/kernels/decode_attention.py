"""Split-KV paged decode attention ("flash-decoding") in Triton.

Decode steps bring one new token a row, so token b is row b and sees its keys 0..positions[b].
Everything a launch needs about the rows (block tables, lengths) is read on the device, and the
grid depends only on shapes and `num_splits`, so a decode bucket's launch can be captured in a
CUDA graph and replayed with new tables and positions in the same buffers.

Two kernels:
  1. `_split_kernel`, grid (B, Hkv, num_splits): one program a (row, kv head, split). It loads
     the `group` query heads that share the kv head once, walks the split's keys in tiles of
     BLOCK_N tokens (gathering each token's page from the block table), and keeps an online
     softmax in fp32. It writes the split's normalised output and its log-sum-exp (log2 domain)
     to scratch; a split with no keys writes only lse = -inf.
  2. `_combine_kernel`, grid (B, H): rescales the splits by exp2(lse - max lse) and sums them
     (and, given the gated attention's output gate, multiplies by its sigmoid: no kernel of the
     gate's own). Given a `meeting`, the last split of each (row, kv head) does this itself and
     the launch is one kernel.

Splits are balanced per row on the device: a row of L keys has ceil(L / BLOCK_N) tiles, split s
takes tiles [s * t, (s + 1) * t) with t = ceil(tiles / num_splits). Sizing the splits by the
block-table width W instead would put a short row's keys all in split 0 when W is the widest a
captured graph allows (max_model_len / page_size).

KV layout: see resident/kernels/attention.py (kv_layer [P, 2, S, Hkv, D], plane 0 keys).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from resident.interpreter import triton_interpreting
from resident.kernels import dot_precision, triton_compute_dtype
from resident.kernels.gdc import KeptZeros, last_to_arrive, pdl_wait_then_release
from resident.kernels.pdl import launch_options as pdl_options

# tl.dot needs every dimension >= 16. The group of query heads sharing a kv head (1..8 for
# Qwen3.5) is padded to 16 rows with masks rather than computed as an elementwise multiply and
# tl.sum: decode attention is bound by reading K/V, so the padded rows of the MMA are free, while
# the elementwise form materialises a [group, BLOCK_N, BLOCK_D] product in registers (spills at
# D = 256) and leaves the tensor cores idle. The same code is then correct for any group size.
_MIN_DOT = 16
# key splits a (row, kv head): decode_splits=off's in every bucket, the fewest auto gives a
# small bucket and the most a wide one (decode_tile)
DEFAULT_DECODE_SPLITS = 8
MAX_DECODE_SPLITS = 64


class DecodeScratch(NamedTuple):
    """Per-split partial results: fixed buffers for a captured graph."""

    partial_out: torch.Tensor  # [B, H, num_splits, D] fp32, each split's normalised output
    partial_lse: torch.Tensor  # [B, H, num_splits] fp32, each split's log2-sum-exp2 of scores


def decode_scratch(batch: int, num_heads: int, head_dim: int, num_splits: int,
                   device: torch.device | str) -> DecodeScratch:
    """Scratch for `paged_decode_attention`; allocate once per (bucket, num_splits) for a graph.
    Its contents need no initialisation: every element is written before it is read."""
    return DecodeScratch(
        torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=device),
        torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=device),
    )


@triton.jit
def _softmax_step(q, k, v, visible, qk_scale, m_i, l_i, acc, DOT_PRECISION: tl.constexpr):
    """One online-softmax step of q [M, D] over a key tile k, v [N, D], `visible` ([M, N] or
    [1, N]) masking scores; returns the new running max [M], sum [M] and accumulator [M, D].
    Every query row must see at least one key of its first tile, so m_new is finite and alpha,
    p are not NaN (alpha = exp2(-inf) = 0 on the first tile). Scores live in the exp2 domain
    (qk_scale = scale * log2(e))."""
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _attend_tile(q, k_base, v_base, table, stride_btw, stride_kvp, stride_kvs, qk_scale,
                 tile, end, m_i, l_i, acc, d_mask,
                 PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Keys [tile, min(tile + BLOCK_N, end)) for every query head of the row."""
    tok = tile + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    valid = tok < end
    page = tl.load(table + (tok // PAGE_SIZE) * stride_btw, mask=valid, other=0)
    # int64 before the multiply: page * stride overflows int32 on a large cache
    slot = page.to(tl.int64) * stride_kvp + (tok % PAGE_SIZE) * stride_kvs  # [BLOCK_N]
    kv_mask = valid[:, None] & d_mask[None, :]
    k = tl.load(k_base + slot[:, None], mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
    v = tl.load(v_base + slot[:, None], mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
    return _softmax_step(q, k, v, valid[None, :], qk_scale, m_i, l_i, acc, DOT_PRECISION)


@triton.jit
def _split_kernel(
    query, kv, block_tables, positions, partial_out, partial_lse,
    qk_scale,  # scale * log2(e): scores live in the exp2 domain
    width,  # W, block-table columns: a row never reads past W * PAGE_SIZE keys
    stride_qb, stride_qh, stride_qd,
    stride_kvp, stride_kvplane, stride_kvs, stride_kvh, stride_kvd,
    stride_btb, stride_btw, stride_posb,
    stride_pob, stride_poh, stride_pos, stride_pod,
    stride_lb, stride_lh, stride_ls,
    out, gate, counts,
    stride_ob, stride_oh, stride_od, stride_gb, stride_gh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, WHILE_LOOP: tl.constexpr,
    USE_PDL: tl.constexpr, MERGED: tl.constexpr, BLOCK_S: tl.constexpr, GATED: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """MERGED: the last split of a (row, kv head) to arrive (counts [B, Hkv], zero between
    launches) combines its group's heads (_combine_head), so the combine has no kernel of its
    own."""
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    pdl_wait_then_release(USE_PDL)

    offs_g = tl.arange(0, BLOCK_G)  # query heads of this kv head (padded)
    offs_d = tl.arange(0, BLOCK_D)  # head dim (padded to a power of two)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g  # [BLOCK_G]

    # This split's keys [start, end), from the row's length on the device.
    kv_len = tl.load(positions + row * stride_posb).to(tl.int64) + 1
    kv_len = tl.maximum(tl.minimum(kv_len, width * PAGE_SIZE), 0)
    tiles_per_split = tl.cdiv(tl.cdiv(kv_len, BLOCK_N), NUM_SPLITS)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, kv_len)

    # q: [BLOCK_G, BLOCK_D], in K's dtype so both dots take one operand type
    q_ptrs = query + row * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    q = q.to(kv.dtype.element_ty)

    k_base = kv + kv_head * stride_kvh + offs_d[None, :] * stride_kvd  # [1, BLOCK_D]
    v_base = k_base + stride_kvplane
    table = block_tables + row * stride_btb

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)  # running max (log2 domain)
    l_i = tl.zeros([BLOCK_G], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)  # running sum of p * V
    if WHILE_LOOP:
        # The interpreter under numpy >= 2.4 cannot take a tensor as a range bound
        # (triton-lang/triton#9171); compiled code keeps the for loop, which Triton pipelines.
        tile = start
        while tile < end:
            m_i, l_i, acc = _attend_tile(q, k_base, v_base, table, stride_btw, stride_kvp,
                                         stride_kvs, qk_scale, tile, end, m_i, l_i, acc, d_mask,
                                         PAGE_SIZE, BLOCK_N, DOT_PRECISION)
            tile += BLOCK_N
    else:
        for tile in range(start, end, BLOCK_N):
            m_i, l_i, acc = _attend_tile(q, k_base, v_base, table, stride_btw, stride_kvp,
                                         stride_kvs, qk_scale, tile, end, m_i, l_i, acc, d_mask,
                                         PAGE_SIZE, BLOCK_N, DOT_PRECISION)

    # An empty split (no tiles) leaves l_i = 0: it writes lse = -inf, which the combine
    # weighs by exactly 0 without reading its output, so that is not written.
    has_keys = l_i > 0
    normed = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))

    po_ptrs = (partial_out + row * stride_pob + heads[:, None] * stride_poh
               + split * stride_pos + offs_d[None, :] * stride_pod)
    tl.store(po_ptrs, normed, mask=(g_mask & has_keys)[:, None] & d_mask[None, :])
    tl.store(partial_lse + row * stride_lb + heads * stride_lh + split * stride_ls, lse,
             mask=g_mask)
    if MERGED:
        count = counts + row * tl.num_programs(1) + kv_head
        if last_to_arrive(count, NUM_SPLITS):
            for g in tl.static_range(GROUP):
                _combine_head(partial_out, partial_lse, out, gate, row, kv_head * GROUP + g,
                              stride_pob, stride_poh, stride_pos, stride_pod, stride_lb,
                              stride_lh, stride_ls, stride_ob, stride_oh, stride_od, stride_gb,
                              stride_gh, HEAD_DIM, NUM_SPLITS, BLOCK_S, BLOCK_D, GATED, COMPUTE,
                              ".cg")
            tl.store(count, 0)


@triton.jit
def _combine_kernel(
    partial_out, partial_lse, out, gate,
    stride_pob, stride_poh, stride_pos, stride_pod,
    stride_lb, stride_lh, stride_ls,
    stride_ob, stride_oh, stride_od,
    stride_gb, stride_gh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr, GATED: tl.constexpr, COMPUTE: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    pdl_wait_then_release(USE_PDL)
    _combine_head(partial_out, partial_lse, out, gate, row, head,
                  stride_pob, stride_poh, stride_pos, stride_pod, stride_lb, stride_lh, stride_ls,
                  stride_ob, stride_oh, stride_od, stride_gb, stride_gh,
                  HEAD_DIM, NUM_SPLITS, BLOCK_S, BLOCK_D, GATED, COMPUTE, "")


@triton.jit
def _combine_head(partial_out, partial_lse, out, gate, row, head,
                  stride_pob, stride_poh, stride_pos, stride_pod, stride_lb, stride_lh, stride_ls,
                  stride_ob, stride_oh, stride_od, stride_gb, stride_gh,
                  HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
                  BLOCK_D: tl.constexpr, GATED: tl.constexpr, COMPUTE: tl.constexpr,
                  CACHE: tl.constexpr):
    """One (row, head)'s output from its splits: rescaled by exp2(lse - max lse) and summed.
    GATED: times sigmoid(gate) (a head's D values contiguous), as dense.sigmoid_gate under
    Inductor: the attention output rounded to the output's dtype, the product in COMPUTE
    rounded once. CACHE: the partials' loads' modifier, ".cg" (past the L1) in the merged
    launch, where other programs of this kernel wrote them."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    d_mask = offs_d < HEAD_DIM

    lse = tl.load(partial_lse + row * stride_lb + head * stride_lh + offs_s * stride_ls,
                  mask=s_mask, other=float("-inf"), cache_modifier=CACHE)  # [BLOCK_S]
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # a row with no keys at all: weights all 0
    weight = tl.exp2(lse - top)  # empty splits: exp2(-inf) = 0

    po_ptrs = (partial_out + row * stride_pob + head * stride_poh
               + offs_s[:, None] * stride_pos + offs_d[None, :] * stride_pod)
    # an empty split's row is not read (a short row leaves most of decode_splits' splits
    # empty), nor multiplied: never 0 * (whatever scratch held)
    part = tl.load(po_ptrs, mask=(s_mask & (weight > 0))[:, None] & d_mask[None, :],
                   other=0.0, cache_modifier=CACHE)
    total = tl.sum(weight, 0)
    result = tl.sum(weight[:, None] * part, 0) / tl.where(total > 0, total, 1.0)  # [BLOCK_D]
    result = result.to(out.dtype.element_ty)
    if GATED:
        by = tl.load(gate + row * stride_gb + head * stride_gh + offs_d, mask=d_mask,
                     other=0.0).to(COMPUTE)
        result = (result.to(COMPUTE) * tl.sigmoid(by)).to(out.dtype.element_ty)
    tl.store(out + row * stride_ob + head * stride_oh + offs_d * stride_od, result,
             mask=d_mask)


class DecodeTile(NamedTuple):
    """How a decode bucket's attention is cut: key splits a (row, kv head), keys a tile."""

    num_splits: int
    block_n: int


def decode_tile(batch: int, num_kv_heads: int, num_sms: int, head_dim: int) -> DecodeTile:
    """The key splits and tile of a decode bucket of `batch` rows (decode_splits=auto).

    A small bucket (8 splits would give its grid at most twice the SMs' programs; the split pass
    holds one program an SM at a time: 236 registers a thread at 8 warps as tools/compile_check
    types it) keeps the kernel's own tile and takes as many splits as give the grid (batch x kv
    heads x splits) twice as many programs as SMs, rounded down, 8 to MAX_DECODE_SPLITS: 8
    splits left most SMs idle (at c=1 on the 0.8B: 16 programs on 132 SMs) while each program
    walked its tiles one after another. On an H100 (results/2026-12-06-h100-decode-splits, µs a
    call at 8 / 16 / 32 / 64 splits): c=1 over 560 keys 8.4 / 7.5 / 7.1 / 6.4, over 4,096 keys
    29.1 / 17.3 / 12.5 / 8.6; c=8 over 4,096 41.1 / 33.0 / 36.3 / 36.4.

    A wider bucket, whose rows alone come near filling the GPU, halves the tile (at D = 256: 16
    keys, 4 warps, 245 registers a thread as compile_check types it: two programs an SM) and
    takes as many splits as give four times the SMs' programs (two waves of two), 1 to 8: 8
    splits cut each row's keys into so few tiles that a program's launch, q load and partials
    outweighed its K/V. On an H100 over 640 keys (results/2026-12-07-h100-decode-tiles, µs a
    call), 8 splits of 32 keys against this rule: 32 rows 24.1 -> 20.3 (8 x 16), 64 rows 42.8 ->
    37.4 (4 x 16), 128 rows 78.1 -> 65.8 (2 x 16), 256 rows 150.8 -> 120.8 (1 x 16: 336 MB of
    K/V at 2.8 TB/s), each the best of 1-8 splits at 16 or 32 keys, and over 4,096 keys too; in
    whole steps -0.7 / -1.5% at c=64 / 128, -2.4% of c=256's GPU time
    (results/2026-12-07-h100-conv-programs).

    A bucket's grid is fixed at capture and splits are balanced on the device by each row's
    length, so a short row leaves the splits past its keys empty: they write only their lse
    (-inf), which is all the combine reads of them."""
    block_n = _own_block_n(_block_d(head_dim))
    pairs = batch * num_kv_heads
    if 2 * num_sms // pairs >= DEFAULT_DECODE_SPLITS:
        return DecodeTile(min(MAX_DECODE_SPLITS, 2 * num_sms // pairs), block_n)
    return DecodeTile(max(1, min(DEFAULT_DECODE_SPLITS, 4 * num_sms // pairs)),
                      max(_MIN_DOT, block_n // 2))


def _block_d(head_dim: int) -> int:
    """A head's columns as the kernels hold them: a power of two, at least tl.dot's 16."""
    return max(triton.next_power_of_2(head_dim), _MIN_DOT)


def _own_block_n(block_d: int) -> int:
    """The kernel's own keys a tile at a head of block_d columns: 32 at 256, 64 below."""
    return 32 if block_d >= 256 else 64


def _tile_config(block_d: int, block_n: int | None) -> tuple[int, dict]:
    """BLOCK_N and launch options. Checked with ptxas for sm_90 (not yet timed on a GPU): at
    D = 256 (32 tokens a tile, 8 warps) and D = 128 (64 tokens, 8 warps) no spills, about 100
    registers a thread, K/V loads pipelined through cp.async by num_stages = 2."""
    if block_n is None:
        block_n = _own_block_n(block_d)
    if block_n < _MIN_DOT or block_n & (block_n - 1):
        raise ValueError(f"block_n {block_n} must be a power of two >= {_MIN_DOT}")
    num_warps = 8 if block_d * block_n >= 8192 else 4
    return block_n, {"num_warps": num_warps, "num_stages": 2}


def paged_decode_attention(
    query: torch.Tensor,  # [B, H, D]
    kv_layer: torch.Tensor,  # [P, 2, S, Hkv, D]
    block_tables: torch.Tensor,  # [B, W] int32: row b's pages in order
    token_seq: torch.Tensor | None,  # [B]: arange(B) for decode; only its shape is checked
    positions: torch.Tensor,  # [B] int64: row b sees its keys 0..positions[b]
    scale: float,
    num_splits: int = DEFAULT_DECODE_SPLITS,
    *,
    out: torch.Tensor | None = None,  # [B, H, D] in query's dtype
    scratch: DecodeScratch | None = None,
    block_n: int | None = None,
    pdl: bool = False,
    gate: torch.Tensor | None = None,  # [B, H, D], each head's D values contiguous
    meeting: KeptZeros | None = None,
) -> torch.Tensor:  # [B, H, D] in query's dtype
    """Decode attention over a paged KV cache: one token a row, the same contract as
    `paged_attention_ref` with token_seq = arange(B).

    Row b attends to keys 0..positions[b] (clipped to W * S, the keys its table can name), read
    on the device; a padding row (table on the sink page, position 0) attends to one key on the
    sink. Rows with positions < 0 get zeros. GQA: H = Hkv * group. Scores and the softmax are
    fp32; q·K and p·V run in the cache's dtype (q is cast to it) with fp32 accumulation.

    The grid is (B, Hkv, num_splits) then (B, H) and nothing is read on the host, so the launch
    can be captured in a CUDA graph. A captured graph wants fixed buffers: pass `out` and
    `scratch` (`decode_scratch(B, H, D, num_splits, device)`); without them both are allocated
    here on every call (the caching allocator keeps that cheap in eager mode, and a graph's
    private pool keeps the allocations valid, but passing them makes the addresses explicit).
    `num_splits` and `block_n` (tokens a tile, a power of two >= 16; by default 32 at D = 256,
    else 64) are compile-time constants: each value is one more compile. pdl: both kernels
    launched with programmatic dependent launch (pdl.py). gate: the gated attention's output
    gate, out * sigmoid(gate) written by the combine (dense.sigmoid_gate's numerics). meeting:
    one kernel, not two: the last split of each (row, kv head) combines its heads, counting in
    at the meeting's counters (kept across launches and graph replays, zero between them).
    """
    _check_inputs(query, kv_layer, block_tables, token_seq, positions, num_splits)
    batch, num_heads, head_dim = query.shape
    page_size, num_kv_heads = kv_layer.shape[2:4]
    group = num_heads // num_kv_heads
    block_d = _block_d(head_dim)
    block_n, launch_options = _tile_config(block_d, block_n)

    if out is None:
        out = torch.empty_like(query)
    if scratch is None:
        scratch = decode_scratch(batch, num_heads, head_dim, num_splits, query.device)
    _check_outputs(query, out, scratch, gate, num_splits)
    partial_out, partial_lse = scratch
    gated = out if gate is None else gate
    counts = meeting.get((batch, num_kv_heads), torch.int32, query.device) \
        if meeting is not None else out
    tail = {"BLOCK_S": triton.next_power_of_2(num_splits), "BLOCK_D": block_d,
            "GATED": gate is not None,
            "COMPUTE": triton_compute_dtype(query.dtype)}
    _split_kernel[(batch, num_kv_heads, num_splits)](
        query, kv_layer, block_tables, positions, partial_out, partial_lse,
        scale * math.log2(math.e), block_tables.shape[1],
        *query.stride(), *kv_layer.stride(), *block_tables.stride(), positions.stride(0),
        *partial_out.stride(), *partial_lse.stride(), out, gated, counts, *out.stride(),
        *gated.stride()[:2],
        GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size, NUM_SPLITS=num_splits,
        BLOCK_G=max(triton.next_power_of_2(group), _MIN_DOT), BLOCK_N=block_n,
        DOT_PRECISION=dot_precision(kv_layer.dtype),
        WHILE_LOOP=triton_interpreting(), MERGED=meeting is not None, **tail,
        **launch_options, **pdl_options(pdl),
    )
    if meeting is None:
        _combine_kernel[(batch, num_heads)](
            partial_out, partial_lse, out, gated,
            *partial_out.stride(), *partial_lse.stride(), *out.stride(), *gated.stride()[:2],
            HEAD_DIM=head_dim, NUM_SPLITS=num_splits, num_warps=4, **tail,
            **pdl_options(pdl),
        )
    return out


def _check_inputs(query: torch.Tensor, kv_layer: torch.Tensor, block_tables: torch.Tensor,
                  token_seq: torch.Tensor | None, positions: torch.Tensor,
                  num_splits: int) -> None:
    """paged_decode_attention's inputs against each other; ValueError naming the misfit."""
    batch, num_heads, head_dim = query.shape
    _, planes, page_size, num_kv_heads, kv_dim = kv_layer.shape
    if planes != 2 or kv_dim != head_dim:
        raise ValueError(f"kv_layer {tuple(kv_layer.shape)} does not fit query "
                         f"{tuple(query.shape)}: want [P, 2, S, Hkv, {head_dim}]")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads} kv heads")
    if page_size & (page_size - 1):
        raise ValueError(f"page size {page_size} is not a power of two")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or positions.shape != (batch,):
        raise ValueError(f"block_tables {tuple(block_tables.shape)} and positions "
                         f"{tuple(positions.shape)} must have {batch} rows")
    if token_seq is not None and token_seq.shape != (batch,):
        raise ValueError(f"decode takes one token a row: token_seq {tuple(token_seq.shape)}")
    if num_splits < 1:
        raise ValueError(f"num_splits {num_splits} < 1")


def _check_outputs(query: torch.Tensor, out: torch.Tensor, scratch: DecodeScratch,
                   gate: torch.Tensor | None, num_splits: int) -> None:
    """paged_decode_attention's out, scratch and gate against its query."""
    batch, num_heads, head_dim = query.shape
    partial_out, partial_lse = scratch
    if partial_out.shape != (batch, num_heads, num_splits, head_dim) or \
            partial_lse.shape != (batch, num_heads, num_splits):
        raise ValueError(f"scratch {tuple(partial_out.shape)}, {tuple(partial_lse.shape)} does "
                         f"not fit B={batch} H={num_heads} splits={num_splits} D={head_dim}")
    if out.shape != query.shape:
        raise ValueError(f"out {tuple(out.shape)} is not query's {tuple(query.shape)}")
    if gate is not None and (gate.shape != query.shape or gate.stride(2) != 1):
        raise ValueError(f"gate {tuple(gate.shape)} must be query's {tuple(query.shape)} with "
                         f"each head's values contiguous, got strides {gate.stride()}")
