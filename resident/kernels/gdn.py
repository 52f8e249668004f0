"""Gated DeltaNet over varlen rows with a slot-indexed state pool: the torch references.

Rows are given by `query_start_loc` ([B+1]: row b owns tokens [qsl[b], qsl[b+1])) and their state
slots; `max_query_len` (a Python int, 1 for decode) bounds the loop, so shapes stay static for a
given step kind. Every row's state is read from the pool, advanced over its tokens, and written
back in place: a fresh sequence's slot must already be zeroed. A decode step (max_query_len == 1)
takes a direct path with no padding or loop, the same arithmetic as the general one (the same
rows give the same bits either way; tests/test_kernel_refs.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from resident.kernels import compute_dtype


def _row_tokens(
    query_start_loc: torch.Tensor, max_query_len: int, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, Lq] token index of each row's i-th new token, `num_tokens` (a trash row) past its end."""
    starts = query_start_loc[:-1, None]
    ends = query_start_loc[1:, None]
    tok = starts + torch.arange(max_query_len, device=query_start_loc.device)[None]
    valid = tok < ends
    return torch.where(valid, tok, num_tokens), valid


def _scatter_rows(rows: torch.Tensor, tok: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[B, Lq, ...] per-row values -> [T, ...] per token (tok as _row_tokens gives it)."""
    out = rows.new_zeros(num_tokens + 1, *rows.shape[2:])
    out[tok] = rows
    return out[:num_tokens]


def _conv_taps(window: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[B, C, Lq, W] windows x [C, W] taps -> [B, C, Lq]: silu of each window's dot product."""
    return F.silu((window.to(weight.dtype) * weight[:, None, :]).sum(-1))


def causal_conv_ref(
    x: torch.Tensor,  # [T, C]
    weight: torch.Tensor,  # [C, W]
    conv_pool: torch.Tensor,  # [N, C, W]: the last W inputs of each slot's sequence
    state_slots: torch.Tensor,  # [B]
    query_start_loc: torch.Tensor,  # [B+1]
    max_query_len: int,
) -> torch.Tensor:  # [T, C], silu applied
    if max_query_len == 1:
        return _causal_conv_one_token(x, weight, conv_pool, state_slots, query_start_loc)
    return _causal_conv_varlen(x, weight, conv_pool, state_slots, query_start_loc, max_query_len)


def _causal_conv_varlen(x, weight, conv_pool, state_slots, query_start_loc,
                        max_query_len: int) -> torch.Tensor:
    """Any number of tokens a row: each row's pool window followed by its tokens, padded to
    max_query_len, every token's window a view of it (unfold)."""
    num_tokens, channels = x.shape
    width = weight.shape[-1]
    tok, valid = _row_tokens(query_start_loc, max_query_len, num_tokens)  # [B, Lq]
    padded = torch.cat([x, x.new_zeros(1, channels)])
    new_inputs = padded[tok].transpose(1, 2)  # [B, C, Lq]
    window = torch.cat([conv_pool[state_slots].to(x.dtype), new_inputs], dim=2)  # [B, C, W+Lq]
    y = _conv_taps(window[:, :, 1:].unfold(2, width, 1), weight).to(x.dtype)  # [B, C, Lq]

    lengths = query_start_loc[1:] - query_start_loc[:-1]  # [B]
    keep = (lengths[:, None] + torch.arange(width, device=x.device)[None])[:, None, :]
    conv_pool[state_slots] = window.gather(2, keep.expand(-1, channels, -1)).to(conv_pool.dtype)
    return _scatter_rows(y.transpose(1, 2), tok, num_tokens)


def _causal_conv_one_token(x, weight, conv_pool, state_slots, query_start_loc) -> torch.Tensor:
    """At most one new token a row (decode): the window shifts by that token, and its output
    is one dot product a channel. The same arithmetic as _causal_conv_varlen."""
    num_tokens = x.shape[0]
    if num_tokens == 0:
        return x.new_zeros(x.shape)
    starts = query_start_loc[:-1]
    has_token = query_start_loc[1:] > starts  # [B]
    old = conv_pool[state_slots].to(x.dtype)  # [B, C, W]
    new_input = x[starts.clamp(max=num_tokens - 1)]  # [B, C]
    window = torch.cat([old[:, :, 1:], new_input[:, :, None]], dim=2)  # [B, C, W]
    y = _conv_taps(window[:, :, None, :], weight).to(x.dtype)  # [B, C, 1]
    shifted = torch.where(has_token[:, None, None], window, old)
    conv_pool[state_slots] = shifted.to(conv_pool.dtype)
    return _scatter_rows(y.transpose(1, 2), torch.where(has_token, starts, num_tokens)[:, None],
                         num_tokens)


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
    *,
    l2norm_qk: bool = True,  # False: query and key come l2-normed (conv_varlen's l2norm_qk)
) -> torch.Tensor:  # [T, Hv, Dv]
    """The delta rule token by token, q/k l2-normed in the kernel and q scaled by Dk**-0.5;
    in fp32 (fp64 for a fp64 state) whatever the state is stored in, the state rounded to its
    pool's dtype once a row's tokens are done (as the kernels: one load, one store)."""
    num_tokens, num_k_heads, k_dim = key.shape
    num_v_heads = value.shape[1]
    compute = compute_dtype(state_pool.dtype)
    repeat = num_v_heads // num_k_heads
    # [T, Hv, ...] in the compute dtype; q and k per value head
    q, k = query.to(compute), key.to(compute)
    if l2norm_qk:
        q, k = l2norm(q), l2norm(k)
    q = q.repeat_interleave(repeat, dim=1) * k_dim**-0.5
    k = k.repeat_interleave(repeat, dim=1)
    v, g, b = value.to(compute), log_decay.to(compute), beta.to(compute)
    if max_query_len == 1:
        out = _delta_rule_one_token(q, k, v, g, b, state_pool, state_slots, query_start_loc)
    else:
        out = _delta_rule_varlen(q, k, v, g, b, state_pool, state_slots, query_start_loc,
                                 max_query_len)
    return out.to(value.dtype)


def _delta_step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                g: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of each row: state [B, Hv, Dk, Dv], q/k [B, Hv, Dk], v [B, Hv, Dv], g/b
    [B, Hv] -> (the updated state, the output [B, Hv, Dv])."""
    decayed = state * g.exp()[..., None, None]
    delta = (v - (k[..., None, :] @ decayed).squeeze(-2)) * b[..., None]
    updated = decayed + k[..., None] * delta[..., None, :]
    return updated, (q[..., None, :] @ updated).squeeze(-2)


def _delta_rule_varlen(q, k, v, g, b, state_pool, state_slots, query_start_loc,
                       max_query_len: int) -> torch.Tensor:
    """Any number of tokens a row: max_query_len steps over all rows, a row's state kept past
    its last token."""
    num_tokens = q.shape[0]

    def padded(t: torch.Tensor) -> torch.Tensor:  # [T, ...] -> [T+1, ...] with a trash row
        return torch.cat([t, t.new_zeros(1, *t.shape[1:])])

    q, k, v, g, b = map(padded, (q, k, v, g, b))
    tok, valid = _row_tokens(query_start_loc, max_query_len, num_tokens)
    state = state_pool[state_slots].to(q.dtype)  # [B, Hv, Dk, Dv]
    outs = []
    for i in range(max_query_len):
        t = tok[:, i]
        updated, out = _delta_step(state, q[t], k[t], v[t], g[t], b[t])
        outs.append(out)
        state = torch.where(valid[:, i, None, None, None], updated, state)
    state_pool[state_slots] = state.to(state_pool.dtype)
    return _scatter_rows(torch.stack(outs, dim=1), tok, num_tokens)


def _delta_rule_one_token(q, k, v, g, b, state_pool, state_slots,
                          query_start_loc) -> torch.Tensor:
    """At most one new token a row (decode): one step, the same arithmetic as
    _delta_rule_varlen."""
    num_tokens = q.shape[0]
    if num_tokens == 0:
        return v.new_zeros(v.shape)
    starts = query_start_loc[:-1]
    has_token = query_start_loc[1:] > starts  # [B]
    row_token = starts.clamp(max=num_tokens - 1)
    state = state_pool[state_slots]
    updated, out = _delta_step(state.to(q.dtype), q[row_token], k[row_token], v[row_token],
                               g[row_token], b[row_token])
    state_pool[state_slots] = torch.where(has_token[:, None, None, None],
                                          updated.to(state.dtype), state)
    return _scatter_rows(out[:, None], torch.where(has_token, starts, num_tokens)[:, None],
                         num_tokens)
