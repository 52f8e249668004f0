"""What a serving engineer asks of a model first, computed from its config alone.

Never builds weights, so the 27B config answers on a laptop. The decode roofline counts the bytes
one decode step must move at batch B: every weight the step reads once (the output projection in
full; an untied input embedding only by the rows it gathers, which is negligible), each sequence's
GDN recurrent state read and written, and each sequence's KV read at `context` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from resident.model.config import ModelConfig

DEFAULT_BATCHES = (1, 16, 64, 256)
STATE_BYTES = 4  # the GDN recurrent state's default (knob gdn_state_dtype): fp32


@dataclass(frozen=True)
class RooflineRow:
    batch: int
    bytes_per_step: int
    ms_per_step: float
    tokens_per_s: float


@dataclass(frozen=True)
class ModelFacts:
    name: str
    num_parameters: int
    weight_bytes: int
    kv_bytes_per_token: int
    gdn_recurrent_bytes_per_seq: int
    gdn_conv_bytes_per_seq: int
    context: int
    bandwidth_tb_s: float
    roofline: tuple[RooflineRow, ...]


def _layer_parameters(config: ModelConfig) -> tuple[int, int, int]:
    """Parameters of one (GDN layer, attention layer, MLP + its two norms)."""
    h = config.hidden_size
    hv = config.linear_num_value_heads
    gdn = (
        h * config.conv_dim  # in_proj_qkv
        + h * config.linear_value_dim  # in_proj_z
        + 2 * h * hv  # in_proj_b, in_proj_a
        + config.conv_dim * config.linear_conv_kernel_dim  # depthwise conv
        + 2 * hv  # A_log, dt_bias
        + config.linear_value_head_dim  # gated norm
        + config.linear_value_dim * h  # out_proj
    )
    q_dim = config.num_attention_heads * config.head_dim
    kv_dim = config.num_key_value_heads * config.head_dim
    attention = h * 2 * q_dim + 2 * h * kv_dim + q_dim * h + 2 * config.head_dim
    mlp = 3 * h * config.intermediate_size + 2 * h
    return gdn, attention, mlp


def parameter_count(config: ModelConfig) -> int:
    gdn, attention, mlp = _layer_parameters(config)
    embedding = config.vocab_size * config.hidden_size
    return (
        embedding * (1 if config.tie_word_embeddings else 2)
        + len(config.linear_layers) * gdn
        + len(config.attention_layers) * attention
        + config.num_hidden_layers * mlp
        + config.hidden_size  # final norm
    )


def gdn_recurrent_bytes(config: ModelConfig, state_bytes: int = STATE_BYTES) -> int:
    """One sequence's GDN recurrent state over every GDN layer: [Hv, Dk, Dv] a layer."""
    return len(config.linear_layers) * (config.linear_num_value_heads * config.linear_key_head_dim
                                        * config.linear_value_head_dim * state_bytes)


def gdn_conv_bytes(config: ModelConfig, dtype_bytes: int) -> int:
    """One sequence's GDN conv window over every GDN layer: [conv_dim, conv_kernel] a layer."""
    return len(config.linear_layers) * config.conv_dim * config.linear_conv_kernel_dim * dtype_bytes


def model_facts(
    config: ModelConfig,
    dtype_bytes: int = 2,
    context: int = 640,
    bandwidth_tb_s: float = 4.28,
    batches: tuple[int, ...] = DEFAULT_BATCHES,
    state_bytes: int = STATE_BYTES,
) -> ModelFacts:
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    if bandwidth_tb_s <= 0:
        raise ValueError(f"bandwidth must be > 0 TB/s, got {bandwidth_tb_s}")
    num_params = parameter_count(config)
    weight_bytes = num_params * dtype_bytes
    untied_embedding = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    decode_weight_bytes = weight_bytes - untied_embedding * dtype_bytes
    recurrent = gdn_recurrent_bytes(config, state_bytes)
    conv = gdn_conv_bytes(config, dtype_bytes)
    kv_per_token = (len(config.attention_layers) * 2 * config.num_key_value_heads
                    * config.head_dim * dtype_bytes)
    per_sequence = 2 * recurrent + context * kv_per_token
    rows = []
    for batch in batches:
        step_bytes = decode_weight_bytes + batch * per_sequence
        seconds = step_bytes / (bandwidth_tb_s * 1e12)
        rows.append(RooflineRow(batch, step_bytes, seconds * 1e3, batch / seconds))
    return ModelFacts(
        name=config.name, num_parameters=num_params, weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_per_token, gdn_recurrent_bytes_per_seq=recurrent,
        gdn_conv_bytes_per_seq=conv, context=context, bandwidth_tb_s=bandwidth_tb_s,
        roofline=tuple(rows),
    )
