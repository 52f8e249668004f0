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
    block table has, and where a row brings several tokens (a prefill) its keys are gathered
    once for them all (`_by_row`); elsewhere each token gathers its row's keys, and the caller
    bounds the work by the block-table width it passes."""
    num_tokens = query.shape[0]
    if positions.device.type == "cpu" and num_tokens:
        # keys past a token's position are masked out below: pages past the furthest one are
        # never seen
        block_tables = block_tables[:, :int(positions.max()) // kv_layer.shape[2] + 1]
        if num_tokens > block_tables.shape[0]:
            return _by_row(query, kv_layer, block_tables, token_seq, positions, scale)
    pages = block_tables[token_seq].long()  # [T, W]
    keys, values = _planes(kv_layer[pages]).to(compute_dtype(query.dtype))  # [T, W*S, Hkv, D]
    return _attend(query, keys, values, positions, scale)


def _planes(paged: torch.Tensor) -> torch.Tensor:
    """[..., W, 2, S, Hkv, D] pages -> [2, ..., W*S, Hkv, D]: keys and values in order."""
    return paged.movedim(-4, 0).flatten(-4, -3)


def _by_row(query: torch.Tensor, kv_layer: torch.Tensor, block_tables: torch.Tensor,
            token_seq: torch.Tensor, positions: torch.Tensor, scale: float) -> torch.Tensor:
    """paged_attention_ref a row at a time (host reads: CPU only): a row's keys gathered once
    and shared by its tokens (a 400-token prompt had gathered 400 copies, most of a CPU
    prefill's time)."""
    out = torch.empty_like(query)
    for row in token_seq.unique().tolist():
        tokens = (token_seq == row).nonzero().squeeze(1)  # [t]
        planes = _planes(kv_layer[block_tables[row].long()]).to(compute_dtype(query.dtype))
        keys, values = (plane.expand(len(tokens), -1, -1, -1) for plane in planes)
        out[tokens] = _attend(query[tokens], keys, values, positions[tokens], scale)
    return out


def _attend(query: torch.Tensor,  # [T, H, D]
            keys: torch.Tensor,  # [T, L, Hkv, D] in the compute dtype, each token's keys
            values: torch.Tensor,  # [T, L, Hkv, D]
            positions: torch.Tensor, scale: float) -> torch.Tensor:  # [T, H, D]
    """A token's scores and output as one small GEMM each, [G, D] x [D, L] and [G, L] x
    [L, D], whatever the batch: a token reads the same bits in any step (a prefix hit's tokens
    as its fresh prefill's), and tokens of a row can share one copy of its keys (stride 0)."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = keys.shape[2]
    q = query.view(num_tokens, num_kv_heads, -1, head_dim).to(keys.dtype)
    hidden = torch.arange(keys.shape[1], device=query.device)[None] > positions[:, None]
    out = torch.empty_like(q)
    for head in range(num_kv_heads):
        scores = torch.bmm(q[:, head], keys[:, :, head].transpose(1, 2)) * scale  # [T, G, L]
        probs = torch.softmax(scores.masked_fill(hidden[:, None, :], float("-inf")), dim=-1)
        out[:, head] = torch.bmm(probs, values[:, :, head])
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
