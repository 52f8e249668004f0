"""A Gated DeltaNet layer's decode in one kernel: from the fused in_proj output to the input of
out_proj.

The unfused decode runs three kernels a GDN layer (the conv update, the delta rule with its
gates, the gated output norm), each a few microseconds of latency for little work at small
batches. Here one program takes one row, one value head and BLOCK_DV of its value columns:
  - the causal conv of its key head's query and key channels (every program of the key head
    computes them: 2 Dk channels of 4 taps) and of its value channels, silu;
  - the gates: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b);
  - q and k l2-normed, q scaled by Dk**-0.5; the delta rule over its [Dk, BLOCK_DV] block of
    the slot's state, in place; its block of the output, rounded, and that block's sum of
    squares;
  - then it counts itself in at its (row, key head). The last program of a (row, key head) to
    arrive (all the others have read the query and key windows and written their outputs)
    shifts the query and key conv windows, finishes the gated RMSNorm of the key head's value
    heads, w * rms_norm(o) * silu(z), from the blocks' sums, and sets the counter back to 0.
Under PDL a program reads its slot, state block, conv windows and gate weights before its wait
(pdl.py), so the state, most of the layer's bytes, streams while the in_proj GEMV before it
runs; only that projection's output is read after the wait. A batch-1 step of the 0.8B has
Hv * Dv / BLOCK_DV = 64 programs (a program a whole key head,
tried first, had 16 and took 11.5 us a layer on the H200 against 7.5 for the three unfused
kernels). Value channels and state blocks belong to one program each; the query and key
windows are written once, after every reader. The arithmetic and its roundings follow the
unfused kernels (gdn_decode.py, then dense.gated_rms_norm as Inductor runs it: the conv output
and the delta rule's output rounded to the activations' dtype, the norm rounded before its
scale, the gated product rounded once).

The counters and the blocks' sums live in GdnLayerScratch, made once for the widest bucket
(graphs keep their addresses). tests/test_kernel_gdn_layer_decode.py checks the kernel against
the references and the unfused kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resident.kernels import compute_dtype, triton_compute_dtype
from resident.kernels.gdc import KeptZeros, last_to_arrive, pdl_wait_then_release
from resident.kernels.gdn_decode import L2NORM_EPS, SOFTPLUS_THRESHOLD
from resident.kernels.layer_shapes import GdnLayerWeights, GdnShape
from resident.kernels.pdl import launch_options

# A program's [Dk, BLOCK_DV] state block: at Dk 128 and 4 warps, 32 floats a thread (a whole
# [128, 128] tile spilled registers at 8 and 16 warps)
BLOCK_DV = 32
NUM_WARPS = 4
# A program's registers at most (ptxas's maxnreg; 0: its own choice). Launched at the 0.8B-9B
# shapes (aligned pointers and strides, unit strides as constants) ptxas gives the kernel 121
# registers a thread, so four 4-warp programs fit an SM and a 16-row step's 1,024 programs run
# in about two rounds; resident.tools.compile_check once compiled it without those hints and
# read 250, which this comment took for the launched count. Capped at CAPPED_REGISTERS ptxas
# allocates 136 and three fit: that cap made the layer 7.7% slower at c=16 on an H100, 128
# (124 allocated, four fit) 2.4% faster, -0.8% of the step from one sample
# (results/2026-12-07-h100-medium-gemv). A program taking 2-4 rows in turn, the next row's
# state read while the row before runs, needs 128-255 registers (two or three programs an SM)
# and lost at 4-32 rows (results/2026-12-07-h100-gdn-rows); so ptxas keeps its choice, one row
# a program
MAX_REGISTERS = 0
CAPPED_REGISTERS = 168


@triton.jit
def _conv_window(pool_slot, w_ptr, c0, stride_wc, stride_ww, stride_cc, stride_cw, width,
                 D: tl.constexpr, BLOCK_W: tl.constexpr):
    """Channels [c0, c0 + D) of a slot's conv pool, shifted one tap left (the last tap 0), and
    their conv weights: ([D, BLOCK_W] each), what a row's conv reads besides its input."""
    offs_c = c0 + tl.arange(0, D)
    offs_w = tl.arange(0, BLOCK_W)
    older = tl.load(pool_slot + offs_c[:, None] * stride_cc + (offs_w + 1)[None, :] * stride_cw,
                    mask=(offs_w + 1 < width)[None, :], other=0.0)
    w = tl.load(w_ptr + offs_c[:, None] * stride_wc + offs_w[None, :] * stride_ww,
                mask=(offs_w < width)[None, :], other=0.0)
    return older, w


@triton.jit
def _conv_apply(x_row, older, w, pool_slot, c0, stride_cc, stride_cw, width, D: tl.constexpr,
                BLOCK_W: tl.constexpr, COMPUTE: tl.constexpr, SHIFT: tl.constexpr):
    """silu of the conv of channels [c0, c0 + D) of one row over _conv_window's window and
    weights, the row's input its last tap, rounded to the input's dtype, in COMPUTE ([D]).
    SHIFT: also write the shifted window back to the pool."""
    offs_c = c0 + tl.arange(0, D)
    offs_w = tl.arange(0, BLOCK_W)
    x = tl.load(x_row + offs_c)
    window = tl.where((offs_w == width - 1)[None, :], x[:, None], older.to(x.dtype))
    acc = tl.sum(window.to(COMPUTE) * w.to(COMPUTE), axis=1)
    if SHIFT:
        tl.store(pool_slot + offs_c[:, None] * stride_cc + offs_w[None, :] * stride_cw,
                 window.to(pool_slot.dtype.element_ty), mask=(offs_w < width)[None, :])
    return (acc / (1.0 + tl.exp(-acc))).to(x.dtype).to(COMPUTE)


@triton.jit
def _gdn_layer_decode_kernel(
    proj_ptr, conv_w_ptr, conv_pool_ptr, state_ptr, slots_ptr, a_log_ptr, dt_bias_ptr,
    norm_w_ptr, out_ptr, sum_sq_ptr, count_ptr,
    stride_pt, stride_wc, stride_ww, stride_cn, stride_cc, stride_cw,
    stride_sn, stride_sh, stride_sk, stride_sv, stride_ot, stride_oh,
    key_dim, value_dim, num_v_heads, width, scale, l2_eps, norm_eps,
    GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_W: tl.constexpr, COMPUTE: tl.constexpr, USE_PDL: tl.constexpr,
):
    """One program: row pid0, value head pid1, value columns [pid2 * BLOCK_DV, +BLOCK_DV). A
    padding row (sink slot 0) writes zeros and touches no pool. sum_sq [B, Hv, DV / BLOCK_DV]
    fp32 and count [B, Hk] int32 (zero between launches) are the programs' meeting place."""
    row, head, block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NUM_BLOCKS: tl.constexpr = DV // BLOCK_DV
    k_head = head // GROUP
    offs_k = tl.arange(0, DK)
    offs_v = block * BLOCK_DV + tl.arange(0, BLOCK_DV)
    # Before the wait, what no kernel of this step writes (pdl.py): the slot, its state block
    # and conv windows, the weights. The state block is most of the layer's bytes, so its read
    # overlaps the in_proj GEMV before; only that projection's output is read after.
    slot = tl.load(slots_ptr + row).to(tl.int64)
    state_ptrs = (state_ptr + slot * stride_sn + head * stride_sh
                  + offs_k[:, None] * stride_sk + offs_v[None, :] * stride_sv)
    s = tl.load(state_ptrs, mask=slot != 0, other=0.0).to(COMPUTE)
    pool_slot = conv_pool_ptr + slot * stride_cn
    q_c0, k_c0 = k_head * DK, key_dim + k_head * DK
    v_c0 = 2 * key_dim + head * DV + block * BLOCK_DV
    q_older, q_w = _conv_window(pool_slot, conv_w_ptr, q_c0, stride_wc, stride_ww, stride_cc,
                                stride_cw, width, DK, BLOCK_W)
    k_older, k_w = _conv_window(pool_slot, conv_w_ptr, k_c0, stride_wc, stride_ww, stride_cc,
                                stride_cw, width, DK, BLOCK_W)
    v_older, v_w = _conv_window(pool_slot, conv_w_ptr, v_c0, stride_wc, stride_ww, stride_cc,
                                stride_cw, width, BLOCK_DV, BLOCK_W)
    decay_rate = -tl.exp(tl.load(a_log_ptr + head).to(COMPUTE))
    dt_bias = tl.load(dt_bias_ptr + head).to(COMPUTE)
    pdl_wait_then_release(USE_PDL)
    out_row = out_ptr + row * stride_ot
    if slot == 0:
        tl.store(out_row + head * stride_oh + offs_v,
                 tl.zeros((BLOCK_DV,), dtype=out_ptr.dtype.element_ty))
        return
    x_row = proj_ptr + row * stride_pt
    q = _conv_apply(x_row, q_older, q_w, pool_slot, q_c0, stride_cc, stride_cw, width, DK,
                    BLOCK_W, COMPUTE, False)
    k = _conv_apply(x_row, k_older, k_w, pool_slot, k_c0, stride_cc, stride_cw, width, DK,
                    BLOCK_W, COMPUTE, False)
    v = _conv_apply(x_row, v_older, v_w, pool_slot, v_c0, stride_cc, stride_cw, width,
                    BLOCK_DV, BLOCK_W, COMPUTE, True)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + l2_eps) * scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + l2_eps)
    z_row = x_row + 2 * key_dim + value_dim  # then z [Hv * Dv], b [Hv], a [Hv]
    a = tl.load(z_row + value_dim + num_v_heads + head).to(COMPUTE)
    b = tl.load(z_row + value_dim + head)
    x = a + dt_bias
    softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(x)))
    s = s * tl.exp(decay_rate * softplus)
    beta = tl.sigmoid(b.to(COMPUTE)).to(b.dtype).to(COMPUTE)
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
    s = s + k[:, None] * delta[None, :]
    dtype = out_ptr.dtype.element_ty
    o = tl.sum(s * q[:, None], axis=0).to(dtype)
    tl.store(state_ptrs, s.to(state_ptr.dtype.element_ty))
    tl.store(out_row + head * stride_oh + offs_v, o)
    o = o.to(COMPUTE)
    tl.store(sum_sq_ptr + (row * num_v_heads + head) * NUM_BLOCKS + block, tl.sum(o * o, axis=0))

    count = count_ptr + row * (num_v_heads // GROUP) + k_head
    if last_to_arrive(count, GROUP * NUM_BLOCKS):
        # the last of its (row, key head): every other program has read the query and key
        # windows and written its output block and sum
        _conv_apply(x_row, q_older, q_w, pool_slot, q_c0, stride_cc, stride_cw, width, DK,
                    BLOCK_W, COMPUTE, True)
        _conv_apply(x_row, k_older, k_w, pool_slot, k_c0, stride_cc, stride_cw, width, DK,
                    BLOCK_W, COMPUTE, True)
        offs_d = tl.arange(0, DV)
        norm_w = tl.load(norm_w_ptr + offs_d).to(COMPUTE)
        for j in tl.static_range(GROUP):
            h = k_head * GROUP + j
            sums = tl.load(sum_sq_ptr + (row * num_v_heads + h) * NUM_BLOCKS
                           + tl.arange(0, NUM_BLOCKS), cache_modifier=".cg")
            head_out = out_row + h * stride_oh + offs_d
            raw = tl.load(head_out, cache_modifier=".cg").to(COMPUTE)
            # the gated norm, as dense.gated_rms_norm under Inductor: the normed value
            # rounded to the activations' dtype, the scaled and gated product rounded once
            rstd = tl.rsqrt(tl.sum(sums, axis=0) / DV + norm_eps)
            normed = (raw * rstd).to(dtype).to(COMPUTE)
            z = tl.load(z_row + h * DV + offs_d).to(COMPUTE)
            tl.store(head_out, (norm_w * normed * (z * tl.sigmoid(z))).to(dtype))
        tl.store(count, 0)


class GdnLayerScratch:
    """The fused kernel's meeting place: each (row, value head, column block)'s sum of
    squares and each (row, key head)'s arrival counter, zero between launches. Kept zeros
    (gdc.KeptZeros) sized for up to `max_rows` rows, so every bucket shares them: a captured
    graph holds their addresses, and a call for more rows fails rather than moving them."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._kept = KeptZeros()

    def get(self, rows: int, shape: GdnShape, num_blocks: int, dtype: torch.dtype,
            device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(sums [max_rows, Hv, blocks] in the kernel's compute dtype, counts [max_rows, Hk])"""
        if rows > self.max_rows:
            raise ValueError(f"GdnLayerScratch holds {self.max_rows} rows, asked for {rows}")
        return (self._kept.get((self.max_rows, shape.num_v_heads, num_blocks), dtype, device),
                self._kept.get((self.max_rows, shape.num_k_heads), torch.int32, device))


def gdn_layer_decode(
    projected: torch.Tensor,  # [B, C + Hv Dv + 2 Hv]: mixed qkv, z, b, a (the in_proj output)
    weights: GdnLayerWeights,
    conv_pool: torch.Tensor,  # [N, C, W]; updated
    state_pool: torch.Tensor,  # [N, Hv, Dk, Dv] gdn_state_dtype's (fp32, bf16, fp64); updated
    state_slots: torch.Tensor,  # [B] int64; 0 (the sink) marks a padding row
    scratch: GdnLayerScratch,
    *,
    pdl: bool = False,
    block_dv: int = BLOCK_DV,
    num_warps: int = NUM_WARPS,
    max_registers: int = MAX_REGISTERS,
) -> torch.Tensor:  # [B, Hv, Dv] in projected's dtype: the input of out_proj
    """One decode token a row through a GDN layer's conv, gates, delta rule and gated norm,
    both pools updated in place. Grid (B, Hv, Dv / block_dv): block_dv, a power of two, is a
    program's value columns and num_warps its warps, max_registers a thread's registers at
    most (the engine's BLOCK_DV, NUM_WARPS and MAX_REGISTERS; tests/gpu/time_gdn_layer.py
    times others)."""
    for name, value in (("block_dv", block_dv), ("num_warps", num_warps)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two, got {value}")
    if max_registers and not 24 <= max_registers <= 255:  # ptxas's maxnreg range
        raise ValueError(f"max_registers must be 0 (ptxas's choice) or 24-255, got "
                         f"{max_registers}")
    shape = GdnShape.of(projected, weights.conv_weight, state_pool)
    group = shape.num_v_heads // shape.num_k_heads
    for name, dim in (("k", shape.k_dim), ("v", shape.v_dim)):
        if dim & (dim - 1):
            raise ValueError(f"the fused GDN decode takes power-of-two head dims, got {name} "
                             f"{dim}")
    if projected.stride(1) != 1 or state_slots.shape[0] != projected.shape[0]:
        raise ValueError(f"projected {tuple(projected.shape)} must have contiguous rows, one "
                         f"a state slot ({state_slots.shape[0]})")
    rows = projected.shape[0]
    out = torch.empty(rows, shape.num_v_heads, shape.v_dim, dtype=projected.dtype,
                      device=projected.device)
    if rows == 0:
        return out
    conv_weight, width = weights.conv_weight, weights.conv_weight.shape[1]
    block_dv = min(block_dv, shape.v_dim)
    compute = compute_dtype(state_pool.dtype)
    sum_sq, counts = scratch.get(rows, shape, shape.v_dim // block_dv, compute,
                                 projected.device)
    _gdn_layer_decode_kernel[(rows, shape.num_v_heads, shape.v_dim // block_dv)](
        projected, conv_weight, conv_pool, state_pool, state_slots, weights.a_log,
        weights.dt_bias, weights.norm_weight, out, sum_sq, counts,
        projected.stride(0), *conv_weight.stride(), *conv_pool.stride(), *state_pool.stride(),
        out.stride(0), out.stride(1),
        shape.key_dim, shape.value_dim, shape.num_v_heads, width, shape.k_dim**-0.5,
        L2NORM_EPS, weights.norm_eps,
        GROUP=group, DK=shape.k_dim, DV=shape.v_dim, BLOCK_DV=block_dv,
        BLOCK_W=triton.next_power_of_2(width),
        COMPUTE=triton_compute_dtype(state_pool.dtype), num_warps=num_warps,
        **({"maxnreg": max_registers} if max_registers else {}), **launch_options(pdl),
    )
    return out

