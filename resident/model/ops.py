"""ModelOps: the kernels one forward calls, chosen per step.

The engine builds one ModelOps per kind of step: prefill and mixed steps get varlen kernels
(padded: the fixed ops of backends/padded.py; eager: FlashInfer paged prefill and fla's chunked
GDN on CUDA), each decode bucket gets decode kernels (Triton or FlashInfer decode attention, the
Triton GDN decode kernels) bound to that bucket's fixed buffers. Every op takes the step's
StepMeta, so a backend reads what it needs from it and carries any host-side plan in its own
closure. The defaults are the torch references.

The optional `*_linear` ops take the elementwise work just before a projection into its GEMM
(the skinny Triton GEMM of decode buckets of at most 16 rows, under decode_gemm=fused). None
keeps the separate DenseOps call and the plain GEMM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from resident.kernels.attention import paged_attention_ref, write_kv_ref
from resident.kernels.gdn import causal_conv_ref, gated_delta_rule_ref
from resident.model.dense import gdn_gates
from resident.model.step import StepMeta

narrow_linear_ref = torch.nn.functional.linear


def embedding_ref_op(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.embedding(ids, weight)


def write_kv_op(kv_layer: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                meta: StepMeta) -> None:
    """Writes each token's K and V ([T, Hkv, D]) at its kv_write_loc."""
    write_kv_ref(kv_layer, key, value, meta.kv_write_loc)


def attention_ref_op(query: torch.Tensor, kv_layer: torch.Tensor, meta: StepMeta,
                     scale: float) -> torch.Tensor:
    """[T, H, D] -> [T, H, D]: causal paged attention, the torch reference."""
    return paged_attention_ref(query, kv_layer, meta.block_tables, meta.token_seq,
                               meta.positions, scale)


def conv_ref_op(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor,
                meta: StepMeta, widths: tuple[int, int, int],
                head_dim: int) -> tuple[torch.Tensor, ...]:
    """[T, C] -> query [T, Kd], key [T, Kd], value [T, Vd] (`widths`): causal depthwise conv +
    silu, pool updated in place. A kernel may return them as views of one [T, C] output or as
    three contiguous tensors (conv_varlen's planes), and may l2-normalise each query and key
    head (head_dim channels) when the delta rule op it is paired with takes them so."""
    del head_dim  # for the kernels that normalise
    return causal_conv_ref(x, weight, conv_pool, meta.state_slots, meta.query_start_loc,
                           meta.max_query_len).split(widths, dim=-1)


def gated_delta_rule_ref_op(query, key, value, a, b, a_log, dt_bias, state_pool: torch.Tensor,
                            meta: StepMeta, *, l2norm_qk: bool = True) -> torch.Tensor:
    """[T, Hv, Dv]: the gated delta rule over each row's tokens, pool updated in place. a, b
    [T, Hv] are the layer's raw gate projections (see dense.gdn_gates). l2norm_qk False: the
    conv before it normalised query and key."""
    log_decay, beta = gdn_gates(a, b, a_log, dt_bias)
    return gated_delta_rule_ref(query, key, value, log_decay, beta, state_pool,
                                meta.state_slots, meta.query_start_loc, meta.max_query_len,
                                l2norm_qk=l2norm_qk)


@dataclass(frozen=True)
class ModelOps:
    """The kernels of one kind of step; the torch references by default."""

    # (embedding weight [V, H], token ids [T]) -> [T, H]
    embed: Callable = embedding_ref_op
    write_kv: Callable = write_kv_op
    attention: Callable = attention_ref_op
    conv: Callable = conv_ref_op
    gated_delta_rule: Callable = gated_delta_rule_ref_op
    # (x, weight) -> x @ weight.T for the projections whose output is narrower than their input
    # (GDN out_proj, attention o_proj, MLP down): cuBLAS picks a split-K kernel for these at a
    # few rows that a skinny Triton kernel beats (resident/kernels/gemv.py). It may return the
    # fp32 split-K partials [S, T, H] instead of [T, H]: each of these outputs goes straight
    # into the next add + norm (DenseOps.add_rms_norm), which adds them up.
    narrow_linear: Callable = narrow_linear_ref
    # (x [T, K], weight [N, K], residual [T, N], norm weight [N], eps) -> (normed, summed):
    # summed = x @ weight.T + residual, normed = DenseOps.rms_norm(summed); a block's closing
    # projection with the next block's opening add + norm in its kernel (kernels/gemv.py
    # skinny_linear_add_norm). None: narrow_linear, then DenseOps.add_rms_norm. Where a
    # *_linear prologue op below is set, that op runs and the norm stays apart.
    narrow_linear_add_norm: Callable | None = None
    # (x [T, H] or partials [S, T, H], residual [T, H], norm weight [H], eps) -> (normed,
    # summed): a block's opening add + norm as its own kernel, as DenseOps.add_rms_norm
    # computes it (kernels/add_norm.py: a row in registers where Inductor's loops over it).
    # None: DenseOps.add_rms_norm.
    add_norm: Callable | None = None
    # (gate_up [T, 2I], down weight [H, I], residual [T, H], norm weight [H], eps) -> (normed,
    # summed): the MLP's silu-mul, down projection and the next block's add + norm in one
    # kernel (gemv.skinny_linear_add_norm, gated). None: DenseOps.silu_mul, then the down
    # projection as narrow_linear_add_norm or narrow_linear says.
    silu_mul_linear_add_norm: Callable | None = None
    # (x, weight) -> x @ weight.T for a block's opening projections (GDN in_proj, attention
    # qkv, MLP gate_up: wider than their input): cuBLAS by default, the Triton GEMV in small
    # buckets under decode_gemm=wide (slower than cuBLAS on the H200, with or without PDL)
    wide_linear: Callable = narrow_linear_ref
    # (h [T, H], gate_up weight [2I, H]) -> silu(gate) * up [T, I]: the MLP's opening
    # projection with its activation in the GEMV's epilogue (gemv.silu_mul_wide_linear).
    # None: wide_linear, then DenseOps.silu_mul.
    silu_mul_wide_linear: Callable | None = None
    # (gate_up [T, 2I], down weight [H, I]) -> down(silu(gate) * up), the MLP's activation and
    # down projection in one kernel; returns what narrow_linear does. None: the MLP runs
    # DenseOps.silu_mul, then narrow_linear.
    silu_mul_linear: Callable | None = None
    # (out [T, Hv, Dv], z [T, Hv, Dv], norm weight, eps, out_proj weight) -> out_proj of the GDN
    # output norm, the norm inside the projection's kernel; returns what narrow_linear does.
    # None: DenseOps.gated_rms_norm, then narrow_linear.
    gated_norm_linear: Callable | None = None
    # (query [T, H, D], gate [T, H, D], kv_layer, meta, scale) -> attention(query) *
    # sigmoid(gate): the gated attention's output gate in the attention kernel's last pass
    # (kernels/decode_attention.py). None: attention, then DenseOps.sigmoid_gate.
    gated_attention: Callable | None = None
    # (attention out [T, H, D], gate [T, H, D], o_proj weight) -> o_proj(out * sigmoid(gate)),
    # the gated attention's output gate inside the projection's kernel; returns what
    # narrow_linear does. None: DenseOps.sigmoid_gate, then narrow_linear.
    sigmoid_gate_linear: Callable | None = None
    # (in_proj output [T, C + Hv Dv + 2 Hv], GdnLayerWeights, conv pool, state pool, meta) ->
    # [T, Hv, Dv], the input of out_proj: a decode GDN layer's conv, gates, delta rule and
    # output norm in one kernel (kernels/gdn_layer_decode.py). None: conv, gated_delta_rule and
    # the norm apart.
    gdn_layer: Callable | None = None
    # (qkv [T, 2 H D + 2 Hkv D], q norm weight, k norm weight, eps, inv_freq, kv_layer, meta,
    # AttentionHeads) -> queries [T, H, D], their keys and values written to the cache: the
    # q/k norm, RoPE and KV write in one kernel (kernels/attention_prologue.py). None: the
    # dense qk_norm_rope over the step's RoPE tables, then write_kv.
    attention_prologue: Callable | None = None
