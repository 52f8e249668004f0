"""The chunked delta rule's state pass, reading and writing each sequence's state in its pool
slot: fla's `chunk_gated_delta_rule_fwd_h` (fla-core 0.6.0, fla/ops/common/chunk_delta_h.py,
MIT, Songlin Yang, Yu Zhang, Zhiyuan Li) with its initial and final states addressed through
`slots` instead of one dense [N, ...] tensor of each.

fla takes a state per sequence, so each GDN layer of a prefill or mixed step gathered its
sequences' states from the pool (an index kernel), fla zero-filled a final-state tensor, derived
its chunk offsets from cu_seqlens on the device (four small kernels) and the layer scattered the
final states back (`index_copy_`): at a padded 2,048-token step that is ~100 MB moved and seven
launches a layer for ~4 MB of real state (17 sequence slots of 1 MB at 0.8B, most of them
padding on the sink). Here a program loads its state tile from `state[slots[n]]`, runs the
chunks and stores the tile back where it came from; the host hands over the chunk offsets with
the chunk table. A program reads its tile before it writes it and no other program touches it;
zero-length sequences (the padding, all on the sink slot) touch nothing. Sequence 0 of a padded
step (its decode tokens, run on the sink only to keep the sequences contiguous) writes the sink,
whose contents nothing reads.

Specialised to what resident runs: key-major states [S, HV, K, V] (fla's state_v_first off), a
scalar gate a head, varlen sequences, K <= 128 as two 64-row tiles of the state (K=128 at
every Qwen3.5 size).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _chunk_step(i_t, length, b_h1, b_h2, k_ptr, u_ptr, w_ptr, v_new_ptr, g_ptr, h_ptr,
                offs_k1, offs_k2, offs_v, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                V: tl.constexpr, BT: tl.constexpr):
    """Chunk i_t of a sequence: store its starting state to h, write its corrected values
    v_new = u - w @ h, and return the state after it, h * decay + k^T @ (decayed v_new). The
    state is two [64, BV] tiles of key rows (the second all masked when K <= 64)."""
    mask_v = offs_v < V
    mask_k1, mask_k2 = offs_k1 < K, offs_k2 < K
    offs_t = i_t * BT + tl.arange(0, BT)
    mask_t = offs_t < length
    chunk_h = h_ptr + i_t * HV * K * V
    tl.store(chunk_h + offs_k1[:, None] * V + offs_v[None, :],
             b_h1.to(h_ptr.dtype.element_ty), mask=mask_k1[:, None] & mask_v[None, :])
    tl.store(chunk_h + offs_k2[:, None] * V + offs_v[None, :],
             b_h2.to(h_ptr.dtype.element_ty), mask=mask_k2[:, None] & mask_v[None, :])
    # [BT, BV]
    b_w = tl.load(w_ptr + offs_t[:, None] * (HV * K) + offs_k1[None, :],
                  mask=mask_t[:, None] & mask_k1[None, :], other=0.0)
    b_v = tl.dot(b_w, b_h1.to(b_w.dtype))
    b_w = tl.load(w_ptr + offs_t[:, None] * (HV * K) + offs_k2[None, :],
                  mask=mask_t[:, None] & mask_k2[None, :], other=0.0)
    b_v = tl.dot(b_w, b_h2.to(b_w.dtype), b_v)
    token_v = offs_t[:, None] * (HV * V) + offs_v[None, :]
    token_mask = mask_t[:, None] & mask_v[None, :]
    b_v = tl.load(u_ptr + token_v, mask=token_mask, other=0.0) - b_v
    tl.store(v_new_ptr + token_v, b_v.to(v_new_ptr.dtype.element_ty), mask=token_mask)

    # decay to the chunk's last token (the gates are log2 sums cumulative within the chunk)
    last = tl.minimum((i_t + 1) * BT, length) - 1
    b_g_last = tl.load(g_ptr + last * HV).to(tl.float32)
    b_g = tl.load(g_ptr + offs_t * HV, mask=mask_t, other=0.0).to(tl.float32)
    b_v = (b_v * tl.where(mask_t, tl.exp2(b_g_last - b_g), 0.0)[:, None]).to(
        k_ptr.dtype.element_ty)
    decay = tl.exp2(b_g_last)
    b_k = tl.load(k_ptr + offs_k1[:, None] + offs_t[None, :] * (H * K),
                  mask=mask_k1[:, None] & mask_t[None, :], other=0.0)
    b_h1 = tl.dot(b_k, b_v, b_h1 * decay)
    b_k = tl.load(k_ptr + offs_k2[:, None] + offs_t[None, :] * (H * K),
                  mask=mask_k2[:, None] & mask_t[None, :], other=0.0)
    b_h2 = tl.dot(b_k, b_v, b_h2 * decay)
    return b_h1, b_h2


@triton.jit
def _chunk_states_kernel(
    k_ptr, u_ptr, w_ptr, v_new_ptr, g_ptr, h_ptr, state_ptr, slots_ptr, cu_ptr, offsets_ptr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BV: tl.constexpr, WHILE_LOOP: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    num_v_blocks = tl.cdiv(V, BV)
    i_v, i_nh = pid % num_v_blocks, pid // num_v_blocks
    i_n, i_h = i_nh // HV, i_nh % HV
    bos = tl.load(cu_ptr + i_n).to(tl.int64)
    length = tl.load(cu_ptr + i_n + 1).to(tl.int64) - bos
    first_chunk = tl.load(offsets_ptr + i_n).to(tl.int64)
    slot = tl.load(slots_ptr + i_n).to(tl.int64)

    h_ptr += (first_chunk * HV + i_h) * K * V
    u_ptr += (bos * HV + i_h) * V
    v_new_ptr += (bos * HV + i_h) * V
    k_ptr += (bos * H + i_h // (HV // H)) * K
    w_ptr += (bos * HV + i_h) * K
    g_ptr += bos * HV + i_h
    state_ptr += (slot * HV + i_h) * K * V

    offs_v = i_v * BV + tl.arange(0, BV)
    offs_k1 = tl.arange(0, 64)
    offs_k2 = 64 + offs_k1
    tile1 = offs_k1[:, None] * V + offs_v[None, :]  # [64, BV] of a [K, V] state
    tile2 = offs_k2[:, None] * V + offs_v[None, :]
    mask1 = (offs_k1 < K)[:, None] & (offs_v < V)[None, :]
    mask2 = (offs_k2 < K)[:, None] & (offs_v < V)[None, :]
    # a zero-length sequence (the sink's padding) neither reads nor writes its slot: a padded
    # 2,048-token step carries 12 of them, 24 MB of state traffic a layer at 0.8B
    if length > 0:
        b_h1 = tl.load(state_ptr + tile1, mask=mask1, other=0.0).to(tl.float32)
        b_h2 = tl.load(state_ptr + tile2, mask=mask2, other=0.0).to(tl.float32)
        if WHILE_LOOP:  # the interpreter cannot take a tensor as a range bound (decode_attention)
            i_t = 0
            while i_t * BT < length:
                b_h1, b_h2 = _chunk_step(i_t, length, b_h1, b_h2, k_ptr, u_ptr, w_ptr, v_new_ptr,
                                         g_ptr, h_ptr, offs_k1, offs_k2, offs_v, H, HV, K, V, BT)
                i_t += 1
        else:
            for i_t in range(tl.cdiv(length, BT)):
                b_h1, b_h2 = _chunk_step(i_t, length, b_h1, b_h2, k_ptr, u_ptr, w_ptr, v_new_ptr,
                                         g_ptr, h_ptr, offs_k1, offs_k2, offs_v, H, HV, K, V, BT)
        tl.store(state_ptr + tile1, b_h1.to(state_ptr.dtype.element_ty), mask=mask1)
        tl.store(state_ptr + tile2, b_h2.to(state_ptr.dtype.element_ty), mask=mask2)


# fla's search space for this kernel on Hopper; tuned at the engine's start-up on real work
# (backends/gdn_prefill.tune_chunked_delta_rule), kept in Triton's cache; the state pool is
# restored after each trial, since the kernel updates it in place
TUNING_CONFIGS = [triton.Config({"BV": bv}, num_warps=warps, num_stages=stages)
                  for warps in (2, 4) for stages in (2, 3, 4) for bv in (32, 64)]
_TUNED = triton.autotune(configs=TUNING_CONFIGS, key=["H", "HV", "K", "V", "BT"],
                         restore_value=["state_ptr"], cache_results=True)(_chunk_states_kernel)
INTERPRETER_BLOCK_V = 32


def chunk_states(key: torch.Tensor, w: torch.Tensor, u: torch.Tensor, g: torch.Tensor,
                 state: torch.Tensor, slots: torch.Tensor, cu_seqlens: torch.Tensor,
                 chunk_offsets: torch.Tensor, num_chunks: int,
                 chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Each chunk's starting state and the chunks' corrected values, over sequences of one
    batch row; sequence n starts from state[slots[n]] and its final state is written back there.

    key [1, T, H, K]; w [1, T, HV, K] and u [1, T, HV, V] (the WY representation); g [1, T, HV]
    fp32 gates, log2 cumulative within each chunk; state [S, HV, K, V]; slots [N];
    cu_seqlens [N + 1]; chunk_offsets [N + 1]: sequence n's first chunk in the chunk table
    (cumulative chunk counts from 0); num_chunks: the table's length (padding included).
    Returns h [1, num_chunks, HV, K, V] in key's dtype (a padding chunk's entry is left
    unwritten) and v_new [1, T, HV, V] like u."""
    _, num_tokens, heads, dim_k = key.shape
    value_heads, dim_v = u.shape[2], u.shape[3]
    if dim_k > 128 or value_heads % heads:
        raise ValueError(f"chunk_states: K={dim_k} (at most 128), HV={value_heads} a multiple "
                         f"of H={heads}")
    if state.shape[1:] != (value_heads, dim_k, dim_v):
        raise ValueError(f"chunk_states: a state {tuple(state.shape)} for HV={value_heads}, "
                         f"K={dim_k}, V={dim_v}")
    h = key.new_empty(1, num_chunks, value_heads, dim_k, dim_v)
    v_new = torch.empty_like(u)
    args = (key, u, w, v_new, g, h, state, slots, cu_seqlens, chunk_offsets)
    shape = dict(H=heads, HV=value_heads, K=dim_k, V=dim_v, BT=chunk_size)
    num_sequences = slots.shape[0]
    if key.is_cuda:
        def grid(meta: dict) -> tuple[int]:
            return (triton.cdiv(dim_v, meta["BV"]) * num_sequences * value_heads,)

        _TUNED[grid](*args, **shape, WHILE_LOOP=False)
    else:  # the interpreter (tests): one fixed config
        grid = (triton.cdiv(dim_v, INTERPRETER_BLOCK_V) * num_sequences * value_heads,)
        _chunk_states_kernel[grid](*args, **shape, BV=INTERPRETER_BLOCK_V, WHILE_LOOP=True)
    return h, v_new


def chunk_states_ref(key: torch.Tensor, w: torch.Tensor, u: torch.Tensor, g: torch.Tensor,
                     state: torch.Tensor, slots: torch.Tensor, cu_seqlens: torch.Tensor,
                     chunk_offsets: torch.Tensor, num_chunks: int,
                     chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """chunk_states in torch, sequence by sequence and chunk by chunk, in fp32 (CPU tests)."""
    value_heads = u.shape[2]
    group = value_heads // key.shape[2]
    h = torch.zeros(1, num_chunks, value_heads, key.shape[3], u.shape[3], dtype=key.dtype)
    v_new = torch.zeros_like(u)
    for n, slot in enumerate(slots.tolist()):
        bos, eos = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        states = state[slot].float()  # [HV, K, V]
        for index, start in enumerate(range(bos, eos, chunk_size)):
            tokens = slice(start, min(start + chunk_size, eos))
            h[0, int(chunk_offsets[n]) + index] = states.to(h.dtype)
            k = key[0, tokens].float().repeat_interleave(group, dim=1)  # [t, HV, K]
            v = u[0, tokens].float() - torch.einsum("thk,hkv->thv", w[0, tokens].float(), states)
            v_new[0, tokens] = v.to(v_new.dtype)
            gates = g[0, tokens].float()  # [t, HV]
            v = v * torch.exp2(gates[-1] - gates)[..., None]
            states = states * torch.exp2(gates[-1])[:, None, None] + torch.einsum(
                "thk,thv->hkv", k, v)
        state[slot] = states.to(state.dtype)
    return h, v_new
