"""Skinny GEMM for decode: y[M, N] = x[M, K] @ w[N, K]^T with M (the rows of a decode bucket) small.

At M = 1..16 a projection is a weight read: 2 N K bytes for 2 M N K flops. This kernel streams
each weight tile once through `tl.dot` (M padded to 16 rows, which costs nothing in a
bandwidth-bound loop) and splits K across programs when N alone gives too few of them to fill
the GPU; the partial sums go to an fp32 scratch.

On the H200 every such GEMM costs at least about 5 us whatever its size (launch, DRAM latency,
tail; results/2026-11-29-h200-0.8b-fusions), and the graph adds about 1 us between kernels, so a
decode step could be cheaper with fewer kernels. The kernel leaves its split-K sums for the
next add + norm (DenseOps.add_rms_norm), and can take the elementwise work just before a
projection into its prologue (see _gemv_kernel; decode_gemm=fused):
- skinny_linear_partials(gated=True): the MLP's silu-mul, then down;
- gated_norm_linear_partials: the GDN output norm, then out_proj;
- sigmoid_gate_linear_partials: the gated attention's output gate, then o_proj.
skinny_linear (a finished [M, N]) is for the bench and the tests. The three prologues do not
spill, but measured slower than their separate elementwise kernels: the 48 GEMMs of a c=1 step
took 514 us with them against 181 without, and the elementwise kernels they replace took under
80; the engine's default (decode_gemm=skinny) runs them apart. The MLP's silu-mul runs in the
epilogue of its gate_up instead (silu_mul_wide_linear, fused_decode=auto): a program pairs a
block of gate rows with their up rows, so the activation costs no kernel and no prologue
(results/2026-12-06-h100-decode-folds: with the attention's gate in its combine and the GDN
layer's early state read, a c=1 step -3.8% on an H100, -6% at c=4 and c=16).

The add + norm after a narrow projection can run in the projection's epilogue instead
(skinny_linear_add_norm, fused_decode=full; _add_norm): the programs that finish last add the
partials up, add the residual and norm the rows, so the norm has no kernel of its own and no
partials tile is held across the K loop. The other way round, the add + norm in the prologue
of the wide projection after it, loaded [16, BLOCK_K] fp32 tiles of the partials in every K
step and spilled registers (python -m resident.tools.compile_check reports spills): a c=1 step's
skinny GEMMs took 3.1 of its 3.5 ms of GPU time (results/2026-11-29-h200-0.8b-fusions).

`python -m resident.tools.bench_gemv` measures it against cuBLAS, with the weights cycled
through more memory than the L2 holds (as in a decode step) and a sweep of tiles.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from resident.kernels import compute_dtype, dot_precision, triton_compute_dtype
from resident.kernels.gdc import KeptZeros, last_to_arrive, pdl_wait_then_release, prefetch_l2
from resident.kernels.pdl import launch_options

MIN_DOT = 16
FMA_MAX_ROWS = 4  # the CUDA-core form's rows at most: above, [rows, block_n, block_k] spills
# The MMA form's row classes: a bucket pads its rows to a power of two (or to its tile's
# block_m) and runs one form a class. At 16 rows a program's tl.dot is the older mma.sync; from
# 64 it is Hopper's warpgroup MMA (wgmma) fed from shared memory by cp.async (python -m
# resident.tools.compile_check compiles both). A measurement at one class says nothing of
# another's (gemv_table.GemvTable.choose, confirm_gemv_table)
ROW_CLASSES = (MIN_DOT, 64, 128, 256)
MAX_ROWS = ROW_CLASSES[-1]
# Under PDL a weight of at most this many bytes is sent to the L2 before the kernel's wait. The
# H200's L2 holds 50 MB; a larger weight (2B's 16-25 MB narrow projections) would evict what the
# kernel before it is still reading and compete with it for HBM: measured in
# results/2026-12-03-h200-decode-sizes (each row then copied 4 times), and with each row copied
# once in results/2026-12-06-h100-prefetch-once (24 MB, the 0.8B's in_proj and gate_up too: a
# c=1 step 3% slower; sent just after the wait instead, as slow). The loop's own weight loads
# cannot be marked to leave the L2 first (to spare what a prefetch sent ahead): Triton 3.6's
# pipeliner makes them cp.async.cg and drops tl.load's eviction_policy (the sm_90 PTX of the
# wide and narrow tiles is the same with evict_first as without).
PREFETCH_MAX_BYTES = 12 << 20
NORM_BLOCK = tl.constexpr(256)  # the add + norm epilogue's columns a step (_norm_rows)


@dataclasses.dataclass(frozen=True)
class GemvTile:
    """A launch shape: block_n output columns by block_k of K per loop step; K is split across
    programs until the grid has about target_programs of them (0: never split). fma: the
    product as CUDA-core multiply-adds over the rows there are (rounded up to a power of two)
    instead of tl.dot's 16-row MMA, for 1-4 rows: a program's block_n x block_k weight tile
    (8-16 KB in the sweep) is loaded at once. At a launch's 16-divisible shapes the MMA form
    pipelines its tiles through shared memory by cp.async over num_stages (the bench's
    compiled-kernel rows on an H100: DEFAULT_TILE 36,864 bytes of shared memory and 38-72
    registers; tools/compile_check compiles it so). Not yet measured on the H200:
    python -m resident.tools.bench_gemv --tiles fma."""

    block_n: int = 32
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3
    target_programs: int = 264  # two waves of the H200's 132 SMs
    # K tiles unrolled (tl.range's loop_unroll_factor): more of a program's loads issued
    # back to back than its pipeline's stages hold
    unroll: int = 1
    fma: bool = False
    # the MMA form's rows a program holds whatever the rows there are (at least them); 0: the
    # rows rounded up to a power of two, at least 16 (block_rows)
    block_m: int = 0

    @property
    def name(self) -> str:
        """As the sweeps and the start-up log print it."""
        rows = f"{self.block_m}x" if self.block_m else ""
        return (f"{'fma ' if self.fma else ''}{rows}{self.block_n}x{self.block_k} "
                f"w{self.num_warps} s{self.num_stages} p{self.target_programs} u{self.unroll}")

    def __post_init__(self) -> None:
        smallest = {"block_n": 1 if self.fma else MIN_DOT, "block_k": MIN_DOT}
        if self.block_m:
            smallest["block_m"] = MIN_DOT
        for name, least in smallest.items():
            value = getattr(self, name)
            if value < least or value & (value - 1):
                raise ValueError(f"GemvTile.{name} must be a power of two >= {least}, "
                                 f"got {value}")
        if self.block_m and (self.fma or self.block_m > MAX_ROWS):
            raise ValueError(f"GemvTile.block_m sets the MMA form's rows, at most {MAX_ROWS} "
                             f"(0 for a CUDA-core tile), got {self.block_m}")
        if self.unroll < 1:
            raise ValueError(f"GemvTile.unroll must be >= 1, got {self.unroll}")
        if self.target_programs < 0:
            raise ValueError(f"GemvTile.target_programs must be >= 0, got "
                             f"{self.target_programs}")


# Within 0.12 us of the cold-L2 sweep's best for all three narrow 0.8B projections (out_proj,
# o_proj: 5.4 us against cuBLAS's 12.6; down: 6.0 against 8.0;
# results/2026-11-29-h200-0.8b-fusions/gemv_cold.json)
DEFAULT_TILE = GemvTile(block_n=32, block_k=128, num_warps=4, num_stages=4, target_programs=264)
# For the wide ones (in_proj, qkv, gate_up), never split: within 0.3 us of cuBLAS alone in the
# same sweep (in_proj 6.48 us against 6.70), 257 programs for the 0.8B's in_proj (the sweep's
# 64x256 tile, level with it, spills registers once the prefetch is in)
WIDE_TILE = GemvTile(block_n=32, block_k=128, num_warps=4, num_stages=4, target_programs=0)
# The CUDA-core form where nothing measured picks one (the MLP's silu-mul + down + next add +
# norm in one kernel at 1-4 rows, fused_decode=full), whose step measured slower than the
# default's on an H100 (results/2026-12-06-h100-decode-splits)
DEFAULT_FMA_TILE = GemvTile(block_n=16, block_k=512, num_warps=4, num_stages=3,
                            target_programs=264, fma=True)
# The MLP's gate_up with its silu-mul in the epilogue (silu_mul_wide_linear): a program reads
# block_n gate rows and the block_n up rows that pair with them, so WIDE_TILE's 32 rows a K
# step and its 224 programs at the 0.8B (never split: the epilogue needs whole sums)
GATED_OUT_TILE = GemvTile(block_n=16, block_k=128, num_warps=4, num_stages=4, target_programs=0)


# what the kernel does to x before the product
PLAIN, SILU_MUL, GATED_RMS_NORM, SIGMOID_GATE = (
    tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3))


@triton.jit
def _gemv_kernel(x, w, out, z, norm_w, M, N, K, stride_xm, stride_wn, stride_om, stride_os,
                 stride_zm, stride_zh, eps, residual, out_norm_w, normed_out, summed_out, counts,
                 sums_sq, out_eps, K_TILES: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PROLOGUE: tl.constexpr,
                 HEAD_DIM: tl.constexpr, UNROLL: tl.constexpr, USE_PDL: tl.constexpr,
                 PREFETCH: tl.constexpr, PREFETCH_CHUNKS: tl.constexpr, ADD_NORM: tl.constexpr,
                 NUM_SPLITS: tl.constexpr, SQ_ROWS: tl.constexpr, NORM_CHUNKS: tl.constexpr,
                 COMPUTE: tl.constexpr, FMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 GATED_OUT: tl.constexpr):
    """What PROLOGUE does to x before the product, in COMPUTE (fp32; fp64 for a fp64 model),
    rounded once to the activations' dtype:
    - SILU_MUL: x is [M, 2K] = (gate, up); the input is silu(gate) * up.
    - GATED_RMS_NORM: each BLOCK_K of x is one head; the input is
      norm_w * rms_norm(x_head) * silu(z_head) (DenseOps.gated_rms_norm).
    - SIGMOID_GATE: the input is x * sigmoid(z) (DenseOps.sigmoid_gate).
    For the two gates z is [M, heads, HEAD_DIM], rows stride_zm and heads stride_zh apart (a
    head's HEAD_DIM values contiguous).
    With USE_PDL and PREFETCH (a weight of at most PREFETCH_MAX_BYTES) the program's weight rows
    start for the L2 before it waits for the kernel before (pdl.py): the weight read overlaps
    that kernel, the loop then reads the L2.
    With ADD_NORM the kernel then runs the next block's opening add + norm (_add_norm). With
    GATED_OUT (one split) w is [2N, K], gate rows then up rows, and the output is
    silu(x @ gate^T) * (x @ up^T) ([M, N]), each product rounded to out's dtype first as the
    separate DenseOps.silu_mul reads them, the result rounded once. FMA:
    the product by CUDA-core multiply-adds, BLOCK_M the rows rounded up to a power of two
    (else tl.dot's 16). DOT_PRECISION: tl.dot's input_precision (kernels.dot_precision)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=COMPUTE)
    if GATED_OUT:
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=COMPUTE)
    # K_TILES is a compile-time count: the interpreter cannot take a tensor as a range bound
    k_start = pid_k * (K_TILES * BLOCK_K)
    if USE_PDL and PREFETCH:
        _prefetch_weight(w, pid_n, N, K, stride_wn, k_start, K_TILES * BLOCK_K, BLOCK_N,
                         PREFETCH_CHUNKS, GATED_OUT)
    pdl_wait_then_release(USE_PDL)
    for tile in tl.range(K_TILES, loop_unroll_factor=UNROLL):
        offs_k = k_start + tile * BLOCK_K + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x_mask = (offs_m[:, None] < M) & k_mask[None, :]
        x_tile = tl.load(x + offs_m[:, None] * stride_xm + offs_k[None, :], mask=x_mask,
                         other=0.0)
        if PROLOGUE == SILU_MUL:
            gate = x_tile.to(COMPUTE)
            up = tl.load(x + offs_m[:, None] * stride_xm + K + offs_k[None, :], mask=x_mask,
                         other=0.0).to(COMPUTE)
            x_tile = (gate * tl.sigmoid(gate) * up).to(x.dtype.element_ty)
        if PROLOGUE == GATED_RMS_NORM:
            head = x_tile.to(COMPUTE)
            rstd = tl.rsqrt(tl.sum(head * head, axis=1) / BLOCK_K + eps)  # [BM]
            normed = (head * rstd[:, None]).to(x.dtype.element_ty).to(COMPUTE)
            gate = _load_heads(z, offs_m, offs_k, x_mask, stride_zm, stride_zh, HEAD_DIM,
                               COMPUTE)
            scale = tl.load(norm_w + tl.arange(0, BLOCK_K)).to(COMPUTE)
            x_tile = (scale[None, :] * normed * gate * tl.sigmoid(gate)).to(x.dtype.element_ty)
        if PROLOGUE == SIGMOID_GATE:
            gate = _load_heads(z, offs_m, offs_k, x_mask, stride_zm, stride_zh, HEAD_DIM,
                               COMPUTE)
            x_tile = (x_tile.to(COMPUTE) * tl.sigmoid(gate)).to(x.dtype.element_ty)
        w_mask = (offs_n[:, None] < N) & k_mask[None, :]
        w_rows = w + offs_n[:, None] * stride_wn + offs_k[None, :]
        acc += _product(x_tile, tl.load(w_rows, mask=w_mask, other=0.0), FMA, COMPUTE,
                        DOT_PRECISION)
        if GATED_OUT:
            acc_up += _product(x_tile, tl.load(w_rows + N * stride_wn, mask=w_mask, other=0.0),
                               FMA, COMPUTE, DOT_PRECISION)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if GATED_OUT:
        gate = acc.to(out.dtype.element_ty).to(COMPUTE)
        acc = gate * tl.sigmoid(gate) * acc_up.to(out.dtype.element_ty).to(COMPUTE)
    tl.store(out + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :],
             acc.to(out.dtype.element_ty), mask=mask)
    if ADD_NORM:
        _add_norm(out, stride_os, stride_om, residual, out_norm_w, normed_out, summed_out, counts,
                  sums_sq, out_eps, M, N, pid_n, offs_m, offs_n, mask, BLOCK_M, BLOCK_N,
                  NUM_SPLITS, SQ_ROWS, NORM_CHUNKS, COMPUTE)


@triton.jit
def _prefetch_weight(w, pid_n, N, K, stride_wn, k_start, K_SPAN: tl.constexpr,
                     BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, GATED_OUT: tl.constexpr):
    """Sends the program's weight rows, from k_start for K_SPAN (at most to K), to the L2:
    its BLOCK_N rows, and under GATED_OUT the up rows N after them."""
    span = tl.minimum(K - k_start, K_SPAN)
    _prefetch_rows(w + k_start, pid_n * BLOCK_N, N, stride_wn, span, BLOCK_N, CHUNKS)
    if GATED_OUT:
        _prefetch_rows(w + N * stride_wn + k_start, pid_n * BLOCK_N, N, stride_wn, span,
                       BLOCK_N, CHUNKS)


@triton.jit
def _prefetch_rows(start, first_row, N, stride, span, BLOCK_N: tl.constexpr,
                   CHUNKS: tl.constexpr):
    """Rows first_row.. (those below N) of `span` elements each, `stride` apart from `start`,
    to the L2, each row as CHUNKS pieces so that each of the program's threads issues one
    copy (BLOCK_N * CHUNKS its threads): a [BLOCK_N] tensor of rows is held whole by every
    warp, and each warp would issue every row (gdc.prefetch_l2)."""
    bits = start.dtype.element_ty.primitive_bitwidth
    row, first, length = row_pieces(first_row, N, span, BLOCK_N, CHUNKS, 128 // bits)
    prefetch_l2(start + row * stride + first, length * bits // 8)


@triton.jit
def row_pieces(first_row, N, span, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr,
               ALIGN: tl.constexpr):
    """[BLOCK_N * CHUNKS] (row, first element, elements) of rows first_row.. cut into CHUNKS
    pieces of whole ALIGN-element units (16 bytes), the last piece taking the rest; a row at
    or past N has pieces of 0 elements."""
    lane = tl.arange(0, BLOCK_N * CHUNKS)
    row = first_row + lane // CHUNKS
    piece = lane % CHUNKS
    piece_len = span // CHUNKS // ALIGN * ALIGN
    length = tl.where(piece == CHUNKS - 1, span - (CHUNKS - 1) * piece_len, piece_len)
    return row, piece * piece_len, tl.where(row < N, length, 0)


@triton.jit
def _product(x_tile, w_tile, FMA: tl.constexpr, COMPUTE: tl.constexpr,
             DOT_PRECISION: tl.constexpr):
    """x_tile [BM, BK] @ w_tile[BN, BK]^T in COMPUTE: tl.dot's MMA, or with FMA CUDA-core
    multiply-adds ([BM, 1, BK] x [1, BN, BK] summed over K: BM is the rows there are)."""
    if FMA:
        return tl.sum(x_tile.to(COMPUTE)[:, None, :] * w_tile.to(COMPUTE)[None, :, :], axis=2)
    return tl.dot(x_tile, tl.trans(w_tile), input_precision=DOT_PRECISION)


@triton.jit
def _add_norm(partials, stride_ps, stride_pm, residual, norm_w, normed, summed, counts, sums_sq,
              eps, M, N, pid_n, offs_m, offs_n, mask, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, SQ_ROWS: tl.constexpr,
              NORM_CHUNKS: tl.constexpr, COMPUTE: tl.constexpr):
    """dense.add_rms_norm of the finished projection, in the programs that finish last, with
    no kernel of its own. The last split of a column block to arrive (an atomic counter a
    block) adds the block's partials up in split order, rounds, adds the residual (rounded,
    `summed`: the next residual stream) and leaves each row's sum of squares of its block;
    the last column block to arrive (counter 0) norms every row of `summed` into `normed`.
    Each last program sets its counter back to 0. residual, summed and normed are [M, N] with
    rows N apart; partials [NUM_SPLITS, M, N] in COMPUTE; sums_sq [SQ_ROWS, BLOCK_M] in COMPUTE,
    SQ_ROWS a power of two at least the column blocks; counts [1 + column blocks] int32, zero
    between launches."""
    dtype = summed.dtype.element_ty
    if last_to_arrive(counts + 1 + pid_n, NUM_SPLITS):
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=COMPUTE)
        for split in tl.static_range(NUM_SPLITS):
            total += tl.load(partials + split * stride_ps + offs_m[:, None] * stride_pm
                             + offs_n[None, :], mask=mask, other=0.0, cache_modifier=".cg")
        at = offs_m[:, None] * N + offs_n[None, :]
        # as torch adds two tensors of the activations' dtype: in fp32 (fp64), rounded once
        added = (total.to(dtype).to(COMPUTE)
                 + tl.load(residual + at, mask=mask, other=0.0).to(COMPUTE)).to(dtype)
        tl.store(summed + at, added, mask=mask)
        added = added.to(COMPUTE)
        tl.store(sums_sq + pid_n * BLOCK_M + offs_m, tl.sum(added * added, axis=1))
        tl.store(counts + 1 + pid_n, 0)
        if last_to_arrive(counts, tl.num_programs(0)):
            _norm_rows(summed, normed, norm_w, sums_sq, eps, M, N, BLOCK_M, SQ_ROWS,
                       NORM_CHUNKS, COMPUTE)
            tl.store(counts, 0)


@triton.jit
def _norm_rows(summed, normed, norm_w, sums_sq, eps, M, N, BLOCK_M: tl.constexpr,
               SQ_ROWS: tl.constexpr, NORM_CHUNKS: tl.constexpr, COMPUTE: tl.constexpr):
    """normed = dense.rms_norm(summed): each row's sum of squares from its column blocks',
    then the rows NORM_BLOCK columns at a time, in NORM_CHUNKS chunks."""
    offs_m = tl.arange(0, BLOCK_M)
    # only this launch's column blocks: a launch of another row block (BLOCK_M) may have left
    # sums past them in the same scratch
    blocks = tl.arange(0, SQ_ROWS)[:, None]
    squares = tl.load(sums_sq + blocks * BLOCK_M + offs_m[None, :],
                      mask=(blocks < tl.num_programs(0)) & (offs_m[None, :] < M), other=0.0,
                      cache_modifier=".cg")
    rstd = tl.rsqrt(tl.sum(squares, axis=0) / N + eps)
    for chunk in tl.static_range(NORM_CHUNKS):
        cols = chunk * NORM_BLOCK + tl.arange(0, NORM_BLOCK)
        mask = (offs_m[:, None] < M) & (cols[None, :] < N)
        at = offs_m[:, None] * N + cols[None, :]
        row = tl.load(summed + at, mask=mask, other=0.0, cache_modifier=".cg").to(COMPUTE)
        scale = 1.0 + tl.load(norm_w + cols, mask=cols < N, other=0.0).to(COMPUTE)
        tl.store(normed + at, (row * rstd[:, None] * scale[None, :]).to(normed.dtype.element_ty),
                 mask=mask)


@triton.jit
def _load_heads(z, offs_m, offs_k, mask, stride_zm, stride_zh, HEAD_DIM: tl.constexpr,
                COMPUTE: tl.constexpr):
    """The [BM, BK] COMPUTE tile of z [M, heads, HEAD_DIM] at flat columns offs_k."""
    columns = (offs_k // HEAD_DIM) * stride_zh + offs_k % HEAD_DIM
    return tl.load(z + offs_m[:, None] * stride_zm + columns[None, :], mask=mask,
                   other=0.0).to(COMPUTE)


@triton.jit
def _sum_splits_kernel(partial, out, M, N, stride_ps, stride_pm, stride_om,
                       NUM_SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    m, n = offs // N, offs % N
    acc = tl.zeros((BLOCK,), dtype=partial.dtype.element_ty)
    for split in tl.static_range(NUM_SPLITS):
        acc += tl.load(partial + split * stride_ps + m * stride_pm + n, mask=mask, other=0.0)
    tl.store(out + m * stride_om + n, acc.to(out.dtype.element_ty), mask=mask)


def gemv_splits(n: int, k: int, tile: GemvTile) -> int:
    """How many K splits bring the grid to about tile.target_programs programs."""
    n_blocks = triton.cdiv(n, tile.block_n)
    k_blocks = triton.cdiv(k, tile.block_k)
    return max(1, min(k_blocks, triton.cdiv(tile.target_programs, n_blocks)))


def skinny_linear(x: torch.Tensor, weight: torch.Tensor,
                  tile: GemvTile = DEFAULT_TILE, *, pdl: bool = False) -> torch.Tensor:
    """x [M, K] (M <= MAX_ROWS, rows contiguous in K) @ weight[N, K]^T -> [M, N] in x's dtype,
    accumulated in fp32. pdl: launched with programmatic dependent launch (pdl.py)."""
    splits, _ = _split(x, weight, tile)
    num_rows, n = x.shape[0], weight.shape[0]
    out = torch.empty(num_rows, n, dtype=x.dtype, device=x.device)
    if splits == 1:
        _launch(x, weight, tile, out.unsqueeze(0), pdl=pdl)
        return out
    partials = torch.empty(splits, num_rows, n, dtype=compute_dtype(x.dtype),
                           device=x.device)
    _launch(x, weight, tile, partials, pdl=pdl)
    block = 1024
    _sum_splits_kernel[(triton.cdiv(num_rows * n, block),)](
        partials, out, num_rows, n, partials.stride(0), partials.stride(1), out.stride(0),
        NUM_SPLITS=splits, BLOCK=block, num_warps=4,
    )
    return out


def wide_linear(x: torch.Tensor, weight: torch.Tensor, *, pdl: bool = False) -> torch.Tensor:
    """skinny_linear on WIDE_TILE: a small bucket's wide projection (N several times K) in one
    kernel, no K split."""
    return skinny_linear(x, weight, WIDE_TILE, pdl=pdl)


def silu_mul_wide_linear(x: torch.Tensor, weight: torch.Tensor,
                         tile: GemvTile = GATED_OUT_TILE, *, pdl: bool = False) -> torch.Tensor:
    """x [M, K] (M <= MAX_ROWS) @ weight[2I, K]^T -> silu(gate) * up [M, I] in x's dtype: the
    MLP's gate_up projection with DenseOps.silu_mul in its epilogue, so the activation has no
    kernel of its own (issue 33). weight is the fused gate_up, gate rows first; tile must not
    split K (its target_programs 0)."""
    if weight.shape[0] % 2 or tile.target_programs:
        raise ValueError(f"silu_mul_wide_linear takes a [2I, K] gate_up weight and a tile that "
                         f"never splits K, got {tuple(weight.shape)} and {tile.name}")
    half = weight[:weight.shape[0] // 2]
    _split(x, half, tile)
    out = torch.empty(x.shape[0], half.shape[0], dtype=x.dtype, device=x.device)
    _launch(x, weight, tile, out.unsqueeze(0), pdl=pdl, gated_out=True)
    return out


def skinny_linear_partials(x: torch.Tensor, weight: torch.Tensor,
                           tile: GemvTile = DEFAULT_TILE, *, gated: bool = False,
                           pdl: bool = False) -> torch.Tensor:
    """As skinny_linear, but -> the partial sums [S, M, N] (fp32; fp64 for a fp64 model:
    compute_dtype) of its S K-splits, left for the consumer to add up
    (DenseOps.add_rms_norm does, inside its fused kernel). With gated, x is an MLP's [M, 2K]
    gate_up and the product is (silu(gate) * up) @ weight^T: the MLP's down projection with
    its activation in the same kernel."""
    return _launch_partials(x, weight, tile, SILU_MUL if gated else PLAIN, gated=gated, pdl=pdl)


def gated_norm_linear_partials(
    x: torch.Tensor,  # [M, H, D]: the GDN output per value head
    gate: torch.Tensor,  # [M, H, D]: z, heads packed in each row (a row may sit in a wider one)
    norm_weight: torch.Tensor,  # [D]
    eps: float,
    weight: torch.Tensor,  # [N, H * D]
    tile: GemvTile = DEFAULT_TILE,
) -> torch.Tensor:  # [S, M, N] partial sums, compute_dtype
    """out_proj(gated_rms_norm(x, gate)) in one kernel: each K tile of the product is one head,
    normed and gated as it is loaded."""
    num_rows, num_heads, head_dim = x.shape
    _check_gated(x, gate)
    if head_dim < MIN_DOT or head_dim & (head_dim - 1):
        raise ValueError(f"the fused GDN output norm takes a power-of-two value head dim >= "
                         f"{MIN_DOT} (one head a K tile), got {head_dim}")
    tile = dataclasses.replace(tile, block_k=head_dim)
    return _launch_partials(x.view(num_rows, num_heads * head_dim), weight, tile,
                            GATED_RMS_NORM, z=gate, norm_weight=norm_weight, eps=eps)


def sigmoid_gate_linear_partials(
    x: torch.Tensor,  # [M, H, D]: attention's output
    gate: torch.Tensor,  # [M, H, D]: its output gate (a strided view, each head's D contiguous)
    weight: torch.Tensor,  # [N, H * D]
    tile: GemvTile = DEFAULT_TILE,
) -> torch.Tensor:  # [S, M, N] partial sums, compute_dtype
    """o_proj(x * sigmoid(gate)) in one kernel: the gated attention's output gate applied as
    each tile of x is loaded."""
    _check_gated(x, gate)
    return _launch_partials(x.view(x.shape[0], -1), weight, tile, SIGMOID_GATE, z=gate)


def sums_rows(columns: int, tile: GemvTile) -> int:
    """The add + norm epilogue's rows of sums of squares: a power of two at least the column
    blocks (_norm_rows reads them as one tile)."""
    return triton.next_power_of_2(triton.cdiv(columns, tile.block_n))


@dataclasses.dataclass(frozen=True)
class AddNorm:
    """The add + norm epilogue's operands: the residual, the norm's weight and eps, the two
    outputs and the scratch (see _add_norm)."""

    residual: torch.Tensor  # [M, N]
    norm_weight: torch.Tensor  # [N]
    eps: float
    normed: torch.Tensor  # [M, N], written
    summed: torch.Tensor  # [M, N], written: the next residual stream
    counts: torch.Tensor
    sums_sq: torch.Tensor

    def kernel_args(self) -> tuple:
        return (self.residual, self.norm_weight, self.normed, self.summed, self.counts,
                self.sums_sq, self.eps)


def skinny_linear_add_norm(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K]
    residual: torch.Tensor,  # [M, N]
    norm_weight: torch.Tensor,  # [N]
    eps: float,
    scratch: KeptZeros,
    tile: GemvTile = DEFAULT_TILE,
    *,
    gated: bool = False,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # normed [M, N], summed [M, N]
    """dense.add_rms_norm(x @ weight^T, residual, norm_weight, eps) in the projection's own
    kernel: a block's closing projection followed by the next block's opening add + norm, with
    no kernel of the norm's own (issue 33). Numerics as add_rms_norm over skinny_linear_partials:
    the split-K partials added in split order in fp32, rounded, the residual added and rounded,
    the norm in fp32 (fp64 for a fp64 model). gated: x is an MLP's [M, 2K] gate_up and the
    product is (silu(gate) * up) @ weight^T, its activation in the prologue (with a CUDA-core
    tile it runs on the rows there are, not 16). The programs meet in `scratch`: an arrival
    counter a column block and one for all, and each (column block, row)'s sum of squares;
    projections of other widths or tiles get their own, and a forward that runs one kernel at
    a time can share one scratch."""
    num_rows, n = x.shape[0], weight.shape[0]
    if num_rows > MIN_DOT:  # _norm_rows holds a [rows, NORM_BLOCK] tile: 16 rows at most
        raise ValueError(f"the add + norm epilogue takes at most {MIN_DOT} rows, got {num_rows}")
    if residual.shape != (num_rows, n) or not residual.is_contiguous() \
            or norm_weight.shape != (n,):
        raise ValueError(f"residual {tuple(residual.shape)} must be a contiguous [{num_rows}, "
                         f"{n}] and norm_weight {tuple(norm_weight.shape)} [{n}]")
    counts = scratch.get((1 + triton.cdiv(n, tile.block_n),), torch.int32, x.device)
    sums_sq = scratch.get((sums_rows(n, tile), MIN_DOT), compute_dtype(x.dtype), x.device)
    add_norm = AddNorm(residual, norm_weight, eps, torch.empty_like(residual),
                       torch.empty_like(residual), counts, sums_sq)
    _launch_partials(x, weight, tile, SILU_MUL if gated else PLAIN, gated=gated, pdl=pdl,
                     add_norm=add_norm)
    return add_norm.normed, add_norm.summed


def _launch_partials(x: torch.Tensor, weight: torch.Tensor, tile: GemvTile,
                     prologue: tl.constexpr, *, gated: bool = False, pdl: bool = False,
                     **prologue_args) -> torch.Tensor:
    """The [S, M, N] partial sums of x @ weight^T after `prologue` (see _launch)."""
    splits, _ = _split(x, weight, tile, gated)
    partials = torch.empty(splits, x.shape[0], weight.shape[0],
                           dtype=compute_dtype(x.dtype), device=x.device)
    _launch(x, weight, tile, partials, prologue, pdl=pdl, **prologue_args)
    return partials


def _check_gated(x: torch.Tensor, gate: torch.Tensor) -> None:
    if not x.is_contiguous() or gate.shape != x.shape or gate.stride(2) != 1:
        raise ValueError(f"x {tuple(x.shape)} must be contiguous and gate {tuple(gate.shape)} "
                         f"the same shape with each head's values contiguous, got strides "
                         f"{x.stride()} and {gate.stride()}")


def _split(x: torch.Tensor, weight: torch.Tensor, tile: GemvTile,
           gated: bool = False) -> tuple[int, int]:
    """(splits, K per split) after checking the operands."""
    num_rows, k = x.shape[0], weight.shape[1]
    most = tile.block_m or MAX_ROWS
    if num_rows > most:
        raise ValueError(f"skinny_linear takes at most {most} rows on tile {tile.name}, got "
                         f"{num_rows}")
    if tile.fma and num_rows > FMA_MAX_ROWS:
        raise ValueError(f"a CUDA-core tile (fma) takes at most {FMA_MAX_ROWS} rows, got "
                         f"{num_rows}")
    if x.shape[1] != (2 * k if gated else k) or x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} must share a "
                         f"contiguous K{' (x holding gate and up)' if gated else ''}")
    return split_plan(weight.shape[0], k, tile)


def row_class(num_rows: int) -> int:
    """The smallest of ROW_CLASSES that holds num_rows rows."""
    if not 0 < num_rows <= MAX_ROWS:
        raise ValueError(f"the GEMV takes 1 to {MAX_ROWS} rows, got {num_rows}")
    return next(rows for rows in ROW_CLASSES if num_rows <= rows)


def block_rows(num_rows: int, tile: GemvTile) -> int:
    """The rows a program's tile holds: the tile's block_m, else the rows rounded up to a
    power of two, at least tl.dot's 16 in the MMA form."""
    if tile.block_m:
        return tile.block_m
    rows = triton.next_power_of_2(num_rows)
    return rows if tile.fma else max(MIN_DOT, rows)


def split_plan(n: int, k: int, tile: GemvTile) -> tuple[int, int]:
    """(splits, K per split) of an [N, K] weight: gemv_splits rounded to whole K tiles, which
    can leave fewer splits than asked."""
    k_per_split = triton.cdiv(triton.cdiv(k, gemv_splits(n, k, tile)), tile.block_k)
    k_per_split *= tile.block_k
    return triton.cdiv(k, k_per_split), k_per_split


def launch_constexprs(n: int, k: int, num_rows: int, tile: GemvTile,
                      prologue: tl.constexpr = PLAIN, *, head_dim: int = 1,
                      element_size: int = 2, add_norm: bool = False,
                      dtype: torch.dtype = torch.bfloat16, gated_out: bool = False) -> dict:
    """_gemv_kernel's compile-time arguments for an [N, K] weight (gated_out: [2N, K]) of
    `element_size`-byte elements and `num_rows` rows of `dtype` activations (USE_PDL aside:
    pdl.launch_options): what _launch passes, and what tools/compile_check compiles."""
    splits, k_per_split = split_plan(n, k, tile)
    weight_bytes = (2 if gated_out else 1) * n * k * element_size
    return {
        "K_TILES": k_per_split // tile.block_k,
        "BLOCK_M": block_rows(num_rows, tile),
        "BLOCK_N": tile.block_n, "BLOCK_K": tile.block_k, "PROLOGUE": prologue,
        "HEAD_DIM": head_dim, "UNROLL": tile.unroll,
        "PREFETCH": weight_bytes <= PREFETCH_MAX_BYTES,
        "PREFETCH_CHUNKS": max(1, 32 * tile.num_warps // tile.block_n),
        "ADD_NORM": add_norm, "NUM_SPLITS": splits,
        "SQ_ROWS": sums_rows(n, tile) if add_norm else 1,
        "NORM_CHUNKS": triton.cdiv(n, NORM_BLOCK.value),
        "COMPUTE": triton_compute_dtype(dtype),
        "FMA": tile.fma,
        "DOT_PRECISION": dot_precision(dtype),
        "GATED_OUT": gated_out,
    }


def _launch(x: torch.Tensor, weight: torch.Tensor, tile: GemvTile, target: torch.Tensor,
            prologue: tl.constexpr = PLAIN, *, z: torch.Tensor | None = None,
            norm_weight: torch.Tensor | None = None, eps: float = 0.0, pdl: bool = False,
            add_norm: AddNorm | None = None, gated_out: bool = False) -> None:
    """target [S, M, N]: split s's sums of x @ weight^T over its K range (split_plan's S), in
    target's dtype. x is [M, K] ([M, 2K] for SILU_MUL); z, norm_weight and eps are the
    prologue's (see _gemv_kernel); add_norm, the epilogue's (_add_norm); gated_out: weight
    is [2N, K] and target [1, M, N] takes silu(gate) * up."""
    (splits, num_rows, n), k = target.shape, weight.shape[1]
    epilogue = add_norm.kernel_args() if add_norm else (x,) * 6 + (0.0,)
    constexprs = launch_constexprs(
        n, k, num_rows, tile, prologue, element_size=weight.element_size(), dtype=x.dtype,
        head_dim=z.shape[2] if z is not None and z.dim() == 3 else 1,
        add_norm=add_norm is not None, gated_out=gated_out)
    _gemv_kernel[(triton.cdiv(n, tile.block_n), splits)](
        x, weight, target, x if z is None else z, x if norm_weight is None else norm_weight,
        num_rows, n, k, x.stride(0), weight.stride(0), target.stride(1), target.stride(0),
        0 if z is None else z.stride(0), 0 if z is None or z.dim() < 3 else z.stride(1), eps,
        *epilogue, **constexprs, num_warps=tile.num_warps, num_stages=tile.num_stages,
        **launch_options(pdl),
    )
