"""Paged attention over a KV cache of pages: the torch reference.

KV layout per attention layer (FlashInfer's NHD single-tensor layout):
    kv_layer: [num_pages, 2, page_size, num_kv_heads, head_dim], plane 0 keys, plane 1 values.
A token's KV location is `page * page_size + offset`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from resident.kernels import compute_dtype


def write_kv_ref(
    kv_layer: torch.Tensor,  # [P, 2, S, Hkv, D]
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    kv_write_loc: torch.Tensor,  # [T] int64
) -> None:
    page_size = kv_layer.shape[2]
    page = kv_write_loc // page_size
    offset = kv_write_loc % page_size
    kv_layer[page, 0, offset] = key.to(kv_layer.dtype)
    kv_layer[page, 1, offset] = value.to(kv_layer.dtype)


def paged_attention_ref(
    query: torch.Tensor,  # [T, H, D]
    kv_layer: torch.Tensor,  # [P, 2, S, Hkv, D]
    block_tables: torch.Tensor,  # [B, W] pages of each row, in order
    token_seq: torch.Tensor,  # [T] int64: the row each token belongs to
    positions: torch.Tensor,  # [T] int64: a token sees its row's keys 0..position
    scale: float,
) -> torch.Tensor:  # [T, H, D]
    """Causal attention of each token over its row's pages, up to its position. On CPU the
    pages read are bounded by the step's furthest position (one host read), whatever width the
    block table has; elsewhere the caller bounds the work by the block-table width it passes."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = kv_layer.shape[3]
    group = num_heads // num_kv_heads
    compute = compute_dtype(query.dtype)

    if positions.device.type == "cpu" and num_tokens:
        # keys past a token's position are masked out below: pages past the furthest one are
        # never seen
        block_tables = block_tables[:, :int(positions.max()) // kv_layer.shape[2] + 1]
    pages = block_tables[token_seq].long()  # [T, W]
    keys = kv_layer[pages, 0].flatten(1, 2).to(compute)  # [T, W*S, Hkv, D]
    values = kv_layer[pages, 1].flatten(1, 2).to(compute)
    visible = torch.arange(keys.shape[1], device=query.device)[None] <= positions[:, None]

    q = query.view(num_tokens, num_kv_heads, group, head_dim).to(compute)
    scores = torch.einsum("tkgd,tlkd->tkgl", q, keys) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("tkgl,tlkd->tkgd", probs, values)
    return out.reshape(num_tokens, num_heads, head_dim).to(query.dtype)


def causal_self_attention(
    query: torch.Tensor,  # [T, H, D]
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    scale: float,
) -> torch.Tensor:  # [T, H, D]
    """Causal attention of one row that starts at position 0 over its own keys, with no pages
    to read: a fresh prefill (runner.py's prefill buckets). Tokens after the row's end (a
    bucket's padding) see the row, never the other way round, so they cannot change it."""
    group = query.shape[1] // key.shape[1]

    def heads_first(x: torch.Tensor) -> torch.Tensor:  # [T, h, D] -> [1, H, T, D]
        return x.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)

    out = F.scaled_dot_product_attention(query.transpose(0, 1).unsqueeze(0), heads_first(key),
                                         heads_first(value), is_causal=True, scale=scale)
    return out[0].transpose(0, 1)
