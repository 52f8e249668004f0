"""Qwen3.5 text model: Gated DeltaNet layers with a gated full-attention layer every few layers.

Module and parameter names follow transformers' `Qwen3_5ForCausalLM`, so a checkpoint's tensors
map one to one (after the `model.language_model.` prefix). The forward takes a flat batch of
tokens and a StepMeta; it reads and writes the ModelCache in place and never leaves the device.
Numerics follow the reference: norms in fp32, softmax in fp32, the GDN recurrence in the state's
dtype (fp32), RoPE tables computed in fp32 and cast to the activation dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from resident.kernels.attention import paged_attention_ref, write_kv_ref
from resident.kernels.gdn import causal_conv_ref, gated_delta_rule_ref
from resident.model.cache import ModelCache
from resident.model.config import ModelConfig
from resident.model.step import StepMeta


@dataclass(frozen=True)
class ModelOps:
    """The kernels a forward calls; the torch references by default. Faster backends replace
    them with implementations of the same signatures."""

    write_kv: Callable = write_kv_ref
    attention: Callable = paged_attention_ref
    conv: Callable = causal_conv_ref
    gated_delta_rule: Callable = gated_delta_rule_ref


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: norm(x) * (1 + w), computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype != torch.float64 else x
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.to(xf.dtype))).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """GDN output norm: w * norm(x) * silu(gate); w is not zero-centred."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(compute)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * normed.to(x.dtype)
        return (out * F.silu(gate.to(compute))).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotary_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [T, rotary_dim], computed in fp32 like the reference."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Partial RoPE on the first rotary_dim dims of each head. x: [T, H, D], cos/sin: [T, R]."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
    x_rot = x_rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat([x_rot, x_pass], dim=-1)


class Attention(nn.Module):
    """Gated full attention: q_proj gives each head its query and an output gate."""

    def __init__(self, config: ModelConfig, cache_index: int, ops: ModelOps) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.cache_index = cache_index
        self.ops = ops
        hidden, qd, kvd = config.hidden_size, self.num_heads * self.head_dim, \
            self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, 2 * qd, bias=False)
        self.k_proj = nn.Linear(hidden, kvd, bias=False)
        self.v_proj = nn.Linear(hidden, kvd, bias=False)
        self.o_proj = nn.Linear(qd, hidden, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        rope: tuple[torch.Tensor, torch.Tensor],
        meta: StepMeta,
        cache: ModelCache,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        query, gate = self.q_proj(x).view(num_tokens, self.num_heads, 2 * self.head_dim).chunk(
            2, dim=-1
        )
        gate = gate.reshape(num_tokens, -1)
        query = self.q_norm(query)
        key = self.k_norm(self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim))
        value = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        query, key = apply_rotary(query, *rope), apply_rotary(key, *rope)

        kv_layer = cache.kv[self.cache_index]
        self.ops.write_kv(kv_layer, key, value, meta.kv_write_loc)
        out = self.ops.attention(query, kv_layer, meta.block_tables, meta.token_seq,
                                 meta.positions, self.head_dim**-0.5)
        out = out.reshape(num_tokens, -1) * torch.sigmoid(gate)
        return self.o_proj(out)


class GatedDeltaNet(nn.Module):
    """Linear attention with the gated delta rule over a depthwise causal conv of q, k and v."""

    def __init__(self, config: ModelConfig, cache_index: int, ops: ModelOps) -> None:
        super().__init__()
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.k_head_dim = config.linear_key_head_dim
        self.v_head_dim = config.linear_value_head_dim
        self.key_dim, self.value_dim = config.linear_key_dim, config.linear_value_dim
        self.cache_index = cache_index
        self.ops = ops
        conv_dim, hidden = config.conv_dim, config.hidden_size
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

    def forward(self, x: torch.Tensor, meta: StepMeta, cache: ModelCache) -> torch.Tensor:
        num_tokens = x.shape[0]
        layer = self.cache_index
        mixed = self.ops.conv(
            self.in_proj_qkv(x), self.conv1d.weight.squeeze(1), cache.conv[layer],
            meta.state_slots, meta.query_start_loc, meta.max_query_len,
        )
        query, key, value = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        query = query.view(num_tokens, self.num_k_heads, self.k_head_dim)
        key = key.view(num_tokens, self.num_k_heads, self.k_head_dim)
        value = value.view(num_tokens, self.num_v_heads, self.v_head_dim)

        beta = self.in_proj_b(x).sigmoid()
        log_decay = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        out = self.ops.gated_delta_rule(
            query, key, value, log_decay, beta, cache.recurrent[layer],
            meta.state_slots, meta.query_start_loc, meta.max_query_len,
        )
        z = self.in_proj_z(x).view(-1, self.v_head_dim)
        out = self.norm(out.reshape(-1, self.v_head_dim), z).view(num_tokens, self.value_dim)
        return self.out_proj(out)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, ops: ModelOps) -> None:
        super().__init__()
        self.is_attention = layer in config.attention_layers
        if self.is_attention:
            self.self_attn = Attention(config, config.attention_layers.index(layer), ops)
        else:
            self.linear_attn = GatedDeltaNet(config, config.linear_layers.index(layer), ops)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope, meta: StepMeta, cache: ModelCache) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.is_attention:
            h = self.self_attn(h, rope, meta, cache)
        else:
            h = self.linear_attn(h, meta, cache)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    def __init__(self, config: ModelConfig, ops: ModelOps) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, ops) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen3_5ForCausalLM(nn.Module):
    """The whole text model. `forward` returns final hidden states for every token;
    `compute_logits` projects the rows a step samples from."""

    def __init__(self, config: ModelConfig, ops: ModelOps | None = None) -> None:
        super().__init__()
        self.config = config
        self.model = TextModel(config, ops or ModelOps())
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        rot = config.rotary_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def init_buffers(self) -> None:
        """Recomputes non-persistent buffers after `to_empty` materialised the module."""
        rot = self.config.rotary_dim
        exponent = torch.arange(0, rot, 2, dtype=torch.float, device=self.inv_freq.device) / rot
        self.inv_freq = 1.0 / (self.config.rope_theta**exponent)

    def output_weight(self) -> torch.Tensor:
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def forward(
        self, input_ids: torch.Tensor, meta: StepMeta, cache: ModelCache
    ) -> torch.Tensor:  # [T, hidden]
        x = self.model.embed_tokens(input_ids)
        rope = rotary_tables(meta.positions, self.inv_freq, x.dtype)
        for layer in self.model.layers:
            x = layer(x, rope, meta, cache)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, V]
        return F.linear(hidden, self.output_weight())
