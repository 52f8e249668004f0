"""The delta rule's state pass by slot (kernels/chunk_states.py) against its torch reference, and
on the GPU the chunked delta rule built on it against fla's own chunk_gated_delta_rule.

Without CUDA the kernel runs under the interpreter (tests/conftest.py), at tiny shapes: one
64-wide key block and two (K=128), value heads sharing a key head, sequences of one partial
chunk, several chunks and none, on scattered slots with the sink's padding sequences after them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from resident.kernels.chunk_states import chunk_states, chunk_states_ref
from resident.model.step import GDN_CHUNK, chunk_table

NUM_SLOTS = 9


@dataclass
class Case:
    """chunk_states' arguments: one batch row of sequences and a state pool."""

    key: torch.Tensor  # [1, T, H, K]
    w: torch.Tensor  # [1, T, HV, K]
    u: torch.Tensor  # [1, T, HV, V]
    g: torch.Tensor  # [1, T, HV] log2 gates, cumulative within each chunk
    state: torch.Tensor  # [NUM_SLOTS, HV, K, V]
    slots: torch.Tensor  # [N]
    cu_seqlens: torch.Tensor  # [N + 1]
    chunk_offsets: torch.Tensor  # [N + 1]
    chunks: torch.Tensor  # [table_rows, 2]
    num_real_chunks: int

    def args(self, state: torch.Tensor | None = None) -> tuple:
        return (self.key, self.w, self.u, self.g, self.state if state is None else state,
                self.slots, self.cu_seqlens, self.chunk_offsets, self.chunks.shape[0])


def _case(lengths: list[int], slots: list[int], heads: int, value_heads: int, dim_k: int,
          dim_v: int, table_rows: int, device: str, dtype: torch.dtype, seed: int = 0) -> Case:
    generator = torch.Generator().manual_seed(seed)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    table = np.zeros((table_rows, 2), np.int64)
    offsets = np.zeros(len(cu), np.int64)
    real = chunk_table(cu, table, offsets, GDN_CHUNK)
    num_tokens = int(cu[-1])

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).to(device)

    key = torch.nn.functional.normalize(randn(1, num_tokens, heads, dim_k), dim=-1).to(dtype)
    w = randn(1, num_tokens, value_heads, dim_k, scale=0.1).to(dtype)
    u = randn(1, num_tokens, value_heads, dim_v).to(dtype)
    g = -torch.rand(1, num_tokens, value_heads, generator=generator).to(device)
    for start, end in zip(cu[:-1], cu[1:], strict=True):
        for first in range(start, end, GDN_CHUNK):
            chunk = slice(first, min(first + GDN_CHUNK, end))
            g[0, chunk] = g[0, chunk].cumsum(0)
    state = randn(NUM_SLOTS, value_heads, dim_k, dim_v, scale=0.1)
    return Case(key, w, u, g, state, *(torch.tensor(a, device=device)
                                       for a in (slots, cu, offsets, table)), real)


# a bf16 pool (gdn_state_dtype=bfloat16): both read it once and round the final state once
@pytest.mark.parametrize(("dim_k", "dim_v", "state_dtype"), [
    (64, 32, torch.float32), (128, 64, torch.float32), (64, 32, torch.bfloat16)])
def test_states_by_slot_match_the_reference(dim_k, dim_v, state_dtype):
    # sequence 0 of 70 tokens straddles two chunks; 0 tokens; one partial chunk; 130 tokens on
    # three chunks; then two zero-length padding sequences on the sink (slot 0)
    case = _case([70, 0, 5, 130, 0, 0], [6, 2, 8, 3, 0, 0], heads=2, value_heads=4,
                 dim_k=dim_k, dim_v=dim_v, table_rows=12, device="cpu", dtype=torch.float32)
    case.state = case.state.to(state_dtype)
    state_tolerance = 1e-4 if state_dtype == torch.float32 else 8e-3
    want_state = case.state.clone()
    h, v_new = chunk_states(*case.args())
    want_h, want_v = chunk_states_ref(*case.args(want_state))
    real = case.num_real_chunks
    torch.testing.assert_close(v_new, want_v, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(h[:, :real], want_h[:, :real], atol=1e-4, rtol=1e-4)
    # every real slot's final state; the slots no sequence names untouched, bit for bit
    named, untouched = [6, 2, 8, 3], [1, 4, 5, 7]
    assert case.state.dtype == state_dtype
    torch.testing.assert_close(case.state[named], want_state[named], atol=state_tolerance,
                               rtol=state_tolerance)
    assert torch.equal(case.state[untouched], want_state[untouched])


def test_the_reference_moves_the_named_slots_only():
    """The reference itself: a sequence with tokens changes its slot, a zero-length one leaves
    its slot as it was (the kernel stores it back unchanged)."""
    case = _case([64, 0], [4, 5], heads=1, value_heads=1, dim_k=64, dim_v=32, table_rows=2,
                 device="cpu", dtype=torch.float32, seed=1)
    before = case.state.clone()
    chunk_states_ref(*case.args())
    changed = [slot for slot in range(NUM_SLOTS) if not torch.equal(before[slot],
                                                                    case.state[slot])]
    assert changed == [4]


def test_a_shape_the_kernel_cannot_take_is_refused():
    case = _case([3], [1], heads=1, value_heads=1, dim_k=192, dim_v=32, table_rows=1,
                 device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="K=192 \\(at most 128\\)"):
        chunk_states(*case.args())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_chunked_delta_rule_matches_fla_at_the_08b_shapes():
    """gdn_prefill.chunked_delta_rule (fla's chunk kernels around our state pass, states by
    slot, host chunk table) against fla's chunk_gated_delta_rule on gathered states, in bf16:
    sequences of 512, 1, 300 and 64 tokens then sink padding, 16 heads of 128."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    from resident.backends.gdn_prefill import chunked_delta_rule

    lengths, slots = [512, 1, 300, 64, 0, 0], [5, 2, 7, 1, 0, 0]
    case = _case(lengths, slots, heads=16, value_heads=16, dim_k=128, dim_v=128,
                 table_rows=20, device="cuda", dtype=torch.bfloat16)
    generator = torch.Generator(device="cuda").manual_seed(4)
    num_tokens = sum(lengths)
    query = torch.nn.functional.normalize(
        torch.randn(num_tokens, 16, 128, device="cuda", generator=generator), dim=-1).bfloat16()
    key, value = case.key[0], case.u[0]
    log_decay = -torch.rand(num_tokens, 16, device="cuda", generator=generator)
    beta = torch.rand(num_tokens, 16, device="cuda", generator=generator).bfloat16()
    pool = torch.randn(NUM_SLOTS, 16, 128, 128, device="cuda", generator=generator) * 0.1
    fla_pool = pool.clone()
    want, final = chunk_gated_delta_rule(
        *(t.unsqueeze(0) for t in (query, key, value, log_decay, beta)), scale=128**-0.5,
        initial_state=fla_pool[case.slots], output_final_state=True, cu_seqlens=case.cu_seqlens)
    fla_pool.index_copy_(0, case.slots[:4], final[:4])
    got = chunked_delta_rule(query, key, value, log_decay, beta, pool, case.slots,
                             case.cu_seqlens, case.chunks, case.chunk_offsets)
    real = int(case.cu_seqlens[4])
    torch.testing.assert_close(got[:real], want[0, :real], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(pool[1:], fla_pool[1:], atol=1e-3, rtol=1e-3)
