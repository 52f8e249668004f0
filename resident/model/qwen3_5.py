"""Qwen3.5 text model: Gated DeltaNet layers with a gated full-attention layer every few layers.

Module and parameter names follow transformers' `Qwen3_5ForCausalLM`, so a checkpoint's tensors
map one to one (after the `model.language_model.` prefix). After loading, `fuse_projections`
concatenates the projections that read the same input (GDN qkv/z/b/a, attention q/k/v, MLP
gate/up) into one weight each, so a layer runs three or four GEMMs; the named parameters become
views into the fused weights, so names, fingerprints and memory stay as they were.

The forward takes a flat batch of tokens, a StepMeta and the step's ModelOps (kernels); it reads
and writes the ModelCache in place and never leaves the device. The dense elementwise parts go
through DenseOps (compiled or not). Numerics follow the reference: norms in fp32, softmax in fp32,
the GDN recurrence in the state's dtype (fp32), RoPE tables in fp32 cast to the activation dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from resident.kernels.layer_shapes import AttentionHeads, GdnLayerWeights
from resident.model.cache import ModelCache
from resident.model.config import ModelConfig
from resident.model.dense import DenseOps
from resident.model.ops import ModelOps
from resident.model.step import StepMeta
from resident.parallel.shard import row_parallel_ops


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm weights; the norm itself is DenseOps.rms_norm."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps


def fuse_linears(owner: nn.Module, name: str, linears: list[nn.Linear]) -> None:
    """Registers `name` as the row-wise concatenation of the linears' weights and re-points
    each linear's weight at its rows of it (a view: no second copy)."""
    fused = torch.cat([linear.weight.detach() for linear in linears])
    owner.register_buffer(name, fused, persistent=False)
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight = nn.Parameter(fused[start:start + rows], requires_grad=False)
        start += rows


class Rope(NamedTuple):
    """A step's RoPE: the inverse frequencies, and the tables (cos, sin [T, rotary_dim]) unless
    every attention layer of the step computes them in its prologue kernel (None)."""

    inv_freq: torch.Tensor
    tables: tuple[torch.Tensor, torch.Tensor] | None


@dataclass(frozen=True)
class BlockInput:
    """A block's input before its RMSNorm: the last block's output x (or the fp32 split-K
    partials [S, T, hidden] of its projection) and the residual stream (None before the first
    layer); or, `normed`, what the norm gives: x = norm(output + residual), residual the sum
    (the last block's projection ran the add + norm in its kernel: block_output)."""

    x: torch.Tensor
    residual: torch.Tensor | None
    norm: RMSNorm
    normed: bool = False

    def normed_input(self, dense: DenseOps,
                     ops: ModelOps) -> tuple[torch.Tensor, torch.Tensor]:
        """(the normed input, the residual stream after the add): the add + norm as
        ops.add_norm where the step's ops set it, else DenseOps'."""
        norm = self.norm
        if self.normed:
            return self.x, self.residual
        if self.residual is None:
            return dense.rms_norm(self.x, norm.weight, norm.eps), self.x
        add_norm = ops.add_norm or dense.add_rms_norm
        return add_norm(self.x, self.residual, norm.weight, norm.eps)

    def project(self, weight: torch.Tensor, dense: DenseOps,
                ops: ModelOps) -> tuple[torch.Tensor, torch.Tensor]:
        """(the block's opening projection of its normed input, the residual stream after the
        add)."""
        h, residual = self.normed_input(dense, ops)
        return ops.wide_linear(h, weight), residual


def block_output(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                 next_norm: RMSNorm, ops: ModelOps) -> BlockInput:
    """A block's closing projection (x @ weight.T, narrower than x) as the input of the block
    after it, which opens with `next_norm`: under ops.narrow_linear_add_norm that add + norm run
    in the projection's kernel."""
    if ops.narrow_linear_add_norm is None:
        return BlockInput(ops.narrow_linear(x, weight), residual, next_norm)
    normed, summed = ops.narrow_linear_add_norm(x, weight, residual, next_norm.weight,
                                                next_norm.eps)
    return BlockInput(normed, summed, next_norm, normed=True)


class GatedRMSNorm(nn.Module):
    """GDN output norm weights (not zero-centred); the norm is DenseOps.gated_rms_norm."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, dense: DenseOps) -> None:
        super().__init__()
        self.dense = dense
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def fuse_projections(self) -> None:
        fuse_linears(self, "gate_up_weight", [self.gate_proj, self.up_proj])

    def forward(self, block: BlockInput, ops: ModelOps, next_norm: RMSNorm) -> BlockInput:
        if ops.silu_mul_wide_linear is not None:
            h, residual = block.normed_input(self.dense, ops)
            return block_output(ops.silu_mul_wide_linear(h, self.gate_up_weight),
                                self.down_proj.weight, residual, next_norm, ops)
        gate_up, residual = block.project(self.gate_up_weight, self.dense, ops)
        if ops.silu_mul_linear is not None:
            return BlockInput(ops.silu_mul_linear(gate_up, self.down_proj.weight), residual,
                              next_norm)
        if ops.silu_mul_linear_add_norm is not None:
            normed, summed = ops.silu_mul_linear_add_norm(
                gate_up, self.down_proj.weight, residual, next_norm.weight, next_norm.eps)
            return BlockInput(normed, summed, next_norm, normed=True)
        return block_output(self.dense.silu_mul(gate_up), self.down_proj.weight, residual,
                            next_norm, ops)


class Attention(nn.Module):
    """Gated full attention: q_proj gives each head its query and an output gate."""

    def __init__(self, config: ModelConfig, cache_index: int, dense: DenseOps) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.cache_index = cache_index
        self.dense = dense
        hidden, qd, kvd = config.hidden_size, self.num_heads * self.head_dim, \
            self.num_kv_heads * self.head_dim
        self.heads = AttentionHeads(self.num_heads, self.num_kv_heads, self.head_dim)
        self.split = self.heads.split
        self.q_proj = nn.Linear(hidden, 2 * qd, bias=False)
        self.k_proj = nn.Linear(hidden, kvd, bias=False)
        self.v_proj = nn.Linear(hidden, kvd, bias=False)
        self.o_proj = nn.Linear(qd, hidden, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def fuse_projections(self) -> None:
        fuse_linears(self, "qkv_weight", [self.q_proj, self.k_proj, self.v_proj])

    def forward(
        self,
        block: BlockInput,
        rope: Rope,
        meta: StepMeta,
        cache: ModelCache,
        ops: ModelOps,
        next_norm: RMSNorm,
    ) -> BlockInput:
        qkv, residual = block.project(self.qkv_weight, self.dense, ops)
        num_tokens, head_dim = qkv.shape[0], self.head_dim
        query_gate, key, value = qkv.split(self.split, dim=-1)
        query, gate = query_gate.view(num_tokens, self.num_heads, 2 * head_dim).chunk(2, dim=-1)
        kv_layer = cache.kv[self.cache_index]
        if ops.attention_prologue is not None:
            query = ops.attention_prologue(qkv, self.q_norm.weight, self.k_norm.weight,
                                           self.q_norm.eps, rope.inv_freq, kv_layer, meta,
                                           self.heads)
        else:
            query, key = self.dense.qk_norm_rope(
                query, key.view(num_tokens, self.num_kv_heads, head_dim), self.q_norm.weight,
                self.k_norm.weight, *rope.tables, self.q_norm.eps)
            ops.write_kv(kv_layer, key, value.view(num_tokens, self.num_kv_heads, head_dim),
                         meta)
        scale = head_dim**-0.5
        if ops.sigmoid_gate_linear is not None:
            out = ops.attention(query, kv_layer, meta, scale)
            return BlockInput(ops.sigmoid_gate_linear(out, gate, self.o_proj.weight), residual,
                              next_norm)
        if ops.gated_attention is not None:
            out = ops.gated_attention(query, gate, kv_layer, meta, scale)
        else:
            out = self.dense.sigmoid_gate(ops.attention(query, kv_layer, meta, scale), gate)
        return block_output(out.reshape(num_tokens, -1), self.o_proj.weight, residual,
                            next_norm, ops)


class GatedDeltaNet(nn.Module):
    """Linear attention with the gated delta rule over a depthwise causal conv of q, k and v."""

    def __init__(self, config: ModelConfig, cache_index: int, dense: DenseOps) -> None:
        super().__init__()
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.k_head_dim = config.linear_key_head_dim
        self.v_head_dim = config.linear_value_head_dim
        self.key_dim, self.value_dim = config.linear_key_dim, config.linear_value_dim
        self.cache_index = cache_index
        self.dense = dense
        conv_dim, hidden = config.conv_dim, config.hidden_size
        self.split = [conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads]
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, config.linear_conv_kernel_dim,
                                groups=conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.v_head_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, hidden, bias=False)
        self.in_proj_qkv = nn.Linear(hidden, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden, self.num_v_heads, bias=False)

    def fuse_projections(self) -> None:
        fuse_linears(self, "in_proj_weight",
                     [self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a])
        # [C, W] once, rather than squeezing the conv's [C, 1, W] weight every step
        self.register_buffer("conv_weight", self.conv1d.weight.detach().squeeze(1),
                             persistent=False)

    def decode_weights(self) -> GdnLayerWeights:
        return GdnLayerWeights(self.conv_weight, self.A_log, self.dt_bias, self.norm.weight,
                               self.norm.eps)

    def forward(self, block: BlockInput, meta: StepMeta, cache: ModelCache, ops: ModelOps,
                next_norm: RMSNorm) -> BlockInput:
        projected, residual = block.project(self.in_proj_weight, self.dense, ops)
        num_tokens, layer = projected.shape[0], self.cache_index
        if ops.gdn_layer is not None:
            out = ops.gdn_layer(projected, self.decode_weights(), cache.conv[layer],
                                cache.recurrent[layer], meta)
            return block_output(out.view(num_tokens, self.value_dim), self.out_proj.weight,
                                residual, next_norm, ops)
        mixed_qkv, z, b, a = projected.split(self.split, dim=-1)
        query, key, value = ops.conv(mixed_qkv, self.conv_weight, cache.conv[layer], meta,
                                     (self.key_dim, self.key_dim, self.value_dim),
                                     self.k_head_dim)
        query = query.view(num_tokens, self.num_k_heads, self.k_head_dim)
        key = key.view(num_tokens, self.num_k_heads, self.k_head_dim)
        value = value.view(num_tokens, self.num_v_heads, self.v_head_dim)

        out = ops.gated_delta_rule(query, key, value, a, b, self.A_log, self.dt_bias,
                                   cache.recurrent[layer], meta)
        z = z.view(num_tokens, self.num_v_heads, self.v_head_dim)
        if ops.gated_norm_linear is not None:
            return BlockInput(ops.gated_norm_linear(out, z, self.norm.weight, self.norm.eps,
                                                    self.out_proj.weight), residual, next_norm)
        out = self.dense.gated_rms_norm(out, z, self.norm.weight, self.norm.eps)
        return block_output(out.reshape(num_tokens, self.value_dim), self.out_proj.weight,
                            residual, next_norm, ops)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, dense: DenseOps) -> None:
        super().__init__()
        self.dense = dense
        self.is_attention = layer in config.attention_layers
        if self.is_attention:
            self.self_attn = Attention(config, config.attention_layers.index(layer), dense)
        else:
            self.linear_attn = GatedDeltaNet(config, config.linear_layers.index(layer), dense)
        self.mlp = MLP(config, dense)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, block: BlockInput, rope, meta: StepMeta, cache: ModelCache,
                ops: ModelOps, next_norm: RMSNorm) -> BlockInput:
        """The layer's input (before its input_layernorm) -> the next one's (before
        next_norm: the next layer's input_layernorm, or the final norm)."""
        middle = self.post_attention_layernorm
        if self.is_attention:
            block = self.self_attn(block, rope, meta, cache, ops, middle)
        else:
            block = self.linear_attn(block, meta, cache, ops, middle)
        return self.mlp(block, ops, next_norm)


class TextModel(nn.Module):
    def __init__(self, config: ModelConfig, dense: DenseOps) -> None:
        super().__init__()
        # _weight: no normal_ init (load_model fills every parameter); on the meta device that
        # init runs a Python decomposition that imports torch._dynamo, ~1.5 s of a CPU start
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, dense) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen3_5ForCausalLM(nn.Module):
    """The whole text model. `forward` returns final hidden states for every token;
    `compute_logits` projects the rows a step samples from. Call `fuse_projections` once the
    weights are in (load_model does)."""

    def __init__(self, config: ModelConfig, ops: ModelOps | None = None,
                 dense: DenseOps | None = None) -> None:
        super().__init__()
        self.config = config
        self.default_ops = ops or ModelOps()
        self.dense = dense or DenseOps()
        self.model = TextModel(config, self.dense)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("inv_freq", torch.empty((config.rotary_dim + 1) // 2),
                             persistent=False)
        if self.inv_freq.device.type != "meta":  # load_model builds on meta, then init_buffers
            self.init_buffers()
        self.fused = False
        # tensor parallel: the in-place all-reduce of the rank group (parallel/group.py) after
        # each row-parallel projection; None on one rank
        self.all_reduce = None

    def init_buffers(self) -> None:
        """Computes the non-persistent buffers: after load_model materialised the module built on
        the meta device (weights._materialise), or from the constructor off it."""
        rot = self.config.rotary_dim
        exponent = torch.arange(0, rot, 2, dtype=torch.float, device=self.inv_freq.device) / rot
        self.inv_freq = 1.0 / (self.config.rope_theta**exponent)

    @torch.no_grad()
    def fuse_projections(self) -> None:
        for layer in self.model.layers:
            (layer.self_attn if layer.is_attention else layer.linear_attn).fuse_projections()
            layer.mlp.fuse_projections()
        self.fused = True

    def output_weight(self) -> torch.Tensor:
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def forward(
        self, input_ids: torch.Tensor, meta: StepMeta, cache: ModelCache,
        ops: ModelOps | None = None,
    ) -> torch.Tensor:  # [T, hidden]
        if not self.fused:
            raise RuntimeError("call fuse_projections() after loading the weights")
        ops = ops or self.default_ops
        if self.all_reduce is not None:  # a few µs a forward, once a graph under capture
            ops = row_parallel_ops(ops, self.all_reduce)
        x = ops.embed(self.model.embed_tokens.weight, input_ids)
        tables = None if ops.attention_prologue is not None else \
            self.dense.rope_tables(meta.positions, self.inv_freq, x.dtype)
        rope = Rope(self.inv_freq, tables)
        layers = self.model.layers
        block = BlockInput(x, None, layers[0].input_layernorm)
        next_norms = [layer.input_layernorm for layer in layers[1:]] + [self.model.norm]
        for layer, next_norm in zip(layers, next_norms, strict=True):
            block = layer(block, rope, meta, cache, ops, next_norm)
        return block.normed_input(self.dense, ops)[0]

    def compute_logits(self, hidden: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor:  # [N, hidden] -> [N, V]
        """out: [N, V] rows of a fixed buffer to write them in (a captured decode step's)."""
        if out is None:
            return F.linear(hidden, self.output_weight())
        return torch.mm(hidden, self.output_weight().t(), out=out)
