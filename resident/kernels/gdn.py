"""Gated DeltaNet over varlen rows with a slot-indexed state pool: the torch references.

Rows are given by `query_start_loc` ([B+1]: row b owns tokens [qsl[b], qsl[b+1])) and their state
slots; `max_query_len` (a Python int, 1 for decode) bounds the loop, so shapes stay static for a
given step kind. Every row's state is read from the pool, advanced over its tokens, and written
back in place: a fresh sequence's slot must already be zeroed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _row_tokens(
    query_start_loc: torch.Tensor, max_query_len: int, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, Lq] token index of each row's i-th new token, `num_tokens` (a trash row) past its end."""
    starts = query_start_loc[:-1, None]
    ends = query_start_loc[1:, None]
    tok = starts + torch.arange(max_query_len, device=query_start_loc.device)[None]
    valid = tok < ends
    return torch.where(valid, tok, num_tokens), valid


def causal_conv_ref(
    x: torch.Tensor,  # [T, C]
    weight: torch.Tensor,  # [C, W]
    conv_pool: torch.Tensor,  # [N, C, W]: the last W inputs of each slot's sequence
    state_slots: torch.Tensor,  # [B]
    query_start_loc: torch.Tensor,  # [B+1]
    max_query_len: int,
) -> torch.Tensor:  # [T, C], silu applied
    num_tokens, channels = x.shape
    width = weight.shape[-1]
    tok, valid = _row_tokens(query_start_loc, max_query_len, num_tokens)  # [B, Lq]
    padded = torch.cat([x, x.new_zeros(1, channels)])
    new_inputs = padded[tok].transpose(1, 2)  # [B, C, Lq]
    window = torch.cat([conv_pool[state_slots].to(x.dtype), new_inputs], dim=2)  # [B, C, W+Lq]
    y = F.conv1d(window[:, :, 1:].to(weight.dtype), weight[:, None, :], groups=channels)
    y = F.silu(y).to(x.dtype)  # [B, C, Lq]

    lengths = query_start_loc[1:] - query_start_loc[:-1]  # [B]
    keep = (lengths[:, None] + torch.arange(width, device=x.device)[None])[:, None, :]
    conv_pool[state_slots] = window.gather(2, keep.expand(-1, channels, -1)).to(conv_pool.dtype)

    out = x.new_zeros(num_tokens + 1, channels)
    out[tok] = y.transpose(1, 2)
    return out[:num_tokens]


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule_ref(
    query: torch.Tensor,  # [T, Hk, Dk]
    key: torch.Tensor,  # [T, Hk, Dk]
    value: torch.Tensor,  # [T, Hv, Dv]
    log_decay: torch.Tensor,  # [T, Hv]: g = -exp(A_log) * softplus(a + dt_bias)
    beta: torch.Tensor,  # [T, Hv]
    state_pool: torch.Tensor,  # [N, Hv, Dk, Dv]
    state_slots: torch.Tensor,  # [B]
    query_start_loc: torch.Tensor,  # [B+1]
    max_query_len: int,
) -> torch.Tensor:  # [T, Hv, Dv]
    """The delta rule token by token, q/k l2-normed in the kernel and q scaled by Dk**-0.5."""
    num_tokens, num_k_heads, k_dim = key.shape
    num_v_heads = value.shape[1]
    compute = state_pool.dtype
    repeat = num_v_heads // num_k_heads

    def prepare(t: torch.Tensor) -> torch.Tensor:  # [T, ...] -> [T+1, ...] with a trash row
        t = t.to(compute)
        return torch.cat([t, t.new_zeros(1, *t.shape[1:])])

    q = prepare(l2norm(query.to(compute)).repeat_interleave(repeat, dim=1) * k_dim**-0.5)
    k = prepare(l2norm(key.to(compute)).repeat_interleave(repeat, dim=1))
    v, g, b = prepare(value), prepare(log_decay), prepare(beta)

    tok, valid = _row_tokens(query_start_loc, max_query_len, num_tokens)
    state = state_pool[state_slots]  # [B, Hv, Dk, Dv]
    out = torch.zeros(num_tokens + 1, num_v_heads, value.shape[2], dtype=compute,
                      device=value.device)
    for i in range(max_query_len):
        t = tok[:, i]
        decayed = state * g[t].exp()[..., None, None]
        k_t = k[t]
        delta = (v[t] - torch.einsum("bhkv,bhk->bhv", decayed, k_t)) * b[t][..., None]
        updated = decayed + k_t[..., None] * delta[..., None, :]
        out[t] = torch.einsum("bhkv,bhk->bhv", updated, q[t])
        state = torch.where(valid[:, i, None, None, None], updated, state)
    state_pool[state_slots] = state
    return out[:num_tokens].to(value.dtype)
