"""The fused GDN layer decode (conv, gates, delta rule, gated norm in one kernel) against the
torch references it replaces, over several steps on slot-indexed pools.

On CPU the kernel runs under the interpreter at tiny shapes (2 key heads, 4 value heads: two
value heads a program); the GPU test runs the 0.8B and 9B head layouts in bf16."""

from __future__ import annotations

import pytest
import torch

from resident.kernels.gdn import causal_conv_ref, gated_delta_rule_ref
from resident.kernels.gdn_decode import causal_conv_decode, gated_delta_rule_decode
from resident.kernels.gdn_layer_decode import (
    GdnLayerScratch,
    GdnLayerWeights,
    GdnShape,
    gdn_layer_decode,
)
from resident.model.dense import gated_rms_norm, gdn_gates

NUM_SLOTS, STEPS = 8, 3
SLOTS = [5, 2, 7, 0]  # three real rows in no slot order, then a padding row on the sink
UNTOUCHED = [1, 3, 4, 6]


def _case(gen, shape: GdnShape, dtype, device, num_slots=NUM_SLOTS, width=4, state_dtype=None):
    def randn(*size, scale=1.0):
        return (torch.randn(*size, generator=gen) * scale).to(device)

    weights = GdnLayerWeights(
        conv_weight=randn(shape.conv_dim, width).to(dtype), a_log=randn(shape.num_v_heads),
        dt_bias=randn(shape.num_v_heads).to(dtype),
        norm_weight=(1 + randn(shape.v_dim, scale=0.1)).to(dtype),
        norm_eps=1e-6)
    conv_pool = randn(num_slots, shape.conv_dim, width).to(dtype)
    state_pool = randn(num_slots, shape.num_v_heads, shape.k_dim, shape.v_dim, scale=0.1)
    if dtype == torch.float64:
        state_pool = state_pool.double()
    return weights, conv_pool, state_pool.to(state_dtype or state_pool.dtype)


def _unfused(conv, delta_rule):
    """The layer from separate ops: conv(x, weight, pool, slots, qsl, 1), then
    delta_rule(q, k, v, a, b, weights, pool, slots, qsl), then dense.gated_rms_norm."""
    def layer(projected, weights, conv_pool, state_pool, state_slots):
        shape = GdnShape.of(projected, weights.conv_weight, state_pool)
        rows = projected.shape[0]
        qsl = torch.arange(rows + 1, device=projected.device)
        mixed, z, b, a = projected.split(shape.split, dim=-1)
        conv_out = conv(mixed, weights.conv_weight, conv_pool, state_slots, qsl, 1)
        query, key, value = conv_out.split([shape.key_dim, shape.key_dim, shape.value_dim],
                                           dim=-1)
        out = delta_rule(query.reshape(rows, shape.num_k_heads, shape.k_dim),
                         key.reshape(rows, shape.num_k_heads, shape.k_dim),
                         value.reshape(rows, shape.num_v_heads, shape.v_dim), a, b, weights,
                         state_pool, state_slots, qsl)
        return gated_rms_norm(out, z.view(rows, shape.num_v_heads, shape.v_dim),
                              weights.norm_weight, weights.norm_eps)
    return layer


# the torch references (every row real: they have no padding rows)
gdn_layer_decode_ref = _unfused(causal_conv_ref, lambda q, k, v, a, b, w, pool, slots, qsl: (
    gated_delta_rule_ref(q, k, v, *gdn_gates(a, b, w.a_log, w.dt_bias), pool, slots, qsl, 1)))
# the unfused decode path's kernels, which the fused kernel replaces in the engine
_unfused_kernels = _unfused(causal_conv_decode, lambda q, k, v, a, b, w, pool, slots, qsl: (
    gated_delta_rule_decode(q, k, v, a, b, pool, slots, qsl, 1,
                            gate_params=(w.a_log, w.dt_bias))))


def _rel_err(out: torch.Tensor, want: torch.Tensor) -> float:
    return ((out.double() - want.double()).norm() / want.double().norm()).item()


# fp32 against the torch references; fp64 (the CPU parity runs) against the unfused kernels
# to fp64 rounding (the reference's gates round through fp32); a bf16 state pool
# (gdn_state_dtype=bfloat16) against the references on one too, each rounding the state once
# a token (the interpreter's cast to bf16 truncates, torch's rounds to nearest: ~0.3% a step,
# tests/test_kernel_gdn_decode.py)
@pytest.mark.parametrize(("dtype", "state_dtype", "unfused", "tolerance"), [
    (torch.float32, None, gdn_layer_decode_ref, 1e-5),
    (torch.float64, None, _unfused_kernels, 1e-13),
    (torch.float32, torch.bfloat16, gdn_layer_decode_ref, 1.5e-2),
])
# v_dim 16: one column block a head, two heads a key head; 64: two blocks a head (BLOCK_DV 32)
@pytest.mark.parametrize("v_dim", [16, 64])
def test_fused_gdn_layer_matches_the_unfused_path_over_steps(dtype, state_dtype, unfused,
                                                             tolerance, v_dim):
    gen = torch.Generator().manual_seed(7)
    shape = GdnShape(num_k_heads=2, num_v_heads=4, k_dim=16, v_dim=v_dim)
    weights, conv_pool, state_pool = _case(gen, shape, dtype, "cpu", state_dtype=state_dtype)
    ref_conv, ref_state = conv_pool.clone(), state_pool.clone()
    start_conv, start_state = conv_pool.clone(), state_pool.clone()
    scratch = GdnLayerScratch(len(SLOTS))
    for step in range(STEPS):
        slots = SLOTS if step % 2 == 0 else SLOTS[::-1]  # rows move between steps
        projected = torch.randn(len(slots), sum(shape.split), generator=gen).to(dtype)
        state_slots = torch.tensor(slots)
        out = gdn_layer_decode(projected, weights, conv_pool, state_pool, state_slots, scratch)
        real = [row for row, slot in enumerate(slots) if slot != 0]
        padding = [row for row, slot in enumerate(slots) if slot == 0]
        want = unfused(projected[real], weights, ref_conv, ref_state, state_slots[real])
        assert out.shape == (len(slots), shape.num_v_heads, shape.v_dim)
        assert torch.equal(out[padding], torch.zeros_like(out[padding])), "padding row output"
        assert _rel_err(out[real], want) < tolerance, f"step {step}: outputs"
        assert torch.equal(conv_pool, ref_conv), f"step {step}: conv windows differ"
        assert _rel_err(state_pool, ref_state) < tolerance, f"step {step}: states"
    assert torch.equal(conv_pool[0], start_conv[0]), "a padding row touched the sink's window"
    assert torch.equal(state_pool[0], start_state[0]), "a padding row touched the sink's state"
    assert torch.equal(state_pool[UNTOUCHED], start_state[UNTOUCHED])
    assert torch.equal(conv_pool[UNTOUCHED], start_conv[UNTOUCHED])


def test_narrower_column_blocks_give_the_same_layer():
    """block_dv 16 (four programs a value head of 64, where the default has two) against the
    default in float64: the same outputs and states to fp64 rounding (the norm's sums of
    squares add in other groups), the same conv windows; a block_dv that is not a power of two,
    and a register cap ptxas would not take, are refused."""
    gen = torch.Generator().manual_seed(11)
    shape = GdnShape(num_k_heads=2, num_v_heads=4, k_dim=16, v_dim=64)
    weights, conv_pool, state_pool = _case(gen, shape, torch.float64, "cpu")
    pools = {16: (conv_pool.clone(), state_pool.clone()), 32: (conv_pool, state_pool)}
    scratch = GdnLayerScratch(len(SLOTS))
    state_slots = torch.tensor(SLOTS)
    for step in range(STEPS):
        projected = torch.randn(len(SLOTS), sum(shape.split), generator=gen).double()
        outs = {block: gdn_layer_decode(projected, weights, *pools[block], state_slots,
                                        scratch, block_dv=block) for block in (16, 32)}
        assert _rel_err(outs[16], outs[32]) < 1e-13, f"step {step}: outputs"
        assert torch.equal(pools[16][0], pools[32][0]), f"step {step}: conv windows"
        assert _rel_err(pools[16][1], pools[32][1]) < 1e-13, f"step {step}: states"
    # four blocks a head met in their own sums: the narrower launch ran
    sums, _ = scratch.get(len(SLOTS), shape, 4, torch.float64, torch.device("cpu"))
    assert sums.any()
    with pytest.raises(ValueError, match="block_dv must be a power of two, got 24"):
        gdn_layer_decode(projected, weights, conv_pool, state_pool, state_slots, scratch,
                         block_dv=24)
    with pytest.raises(ValueError, match="num_warps must be a power of two, got 3"):
        gdn_layer_decode(projected, weights, conv_pool, state_pool, state_slots, scratch,
                         num_warps=3)
    with pytest.raises(ValueError, match="max_registers must be 0 .* got 300"):
        gdn_layer_decode(projected, weights, conv_pool, state_pool, state_slots, scratch,
                         max_registers=300)


def test_a_mismatched_layer_is_refused():
    gen = torch.Generator().manual_seed(1)
    shape = GdnShape(num_k_heads=2, num_v_heads=4, k_dim=16, v_dim=16)
    weights, conv_pool, state_pool = _case(gen, shape, torch.float32, "cpu")
    projected = torch.randn(2, sum(shape.split) + 1)
    with pytest.raises(ValueError, match="do not describe one GDN layer"):
        gdn_layer_decode(projected, weights, conv_pool, state_pool, torch.tensor([1, 2]),
                         GdnLayerScratch(2))



def test_the_scratch_is_shared_by_every_bucket_and_refuses_more_rows():
    shape = GdnShape(num_k_heads=2, num_v_heads=4, k_dim=16, v_dim=16)
    scratch = GdnLayerScratch(4)
    sums, counts = scratch.get(1, shape, 2, torch.float32, torch.device("cpu"))
    assert sums.shape == (4, 4, 2) and counts.shape == (4, 2) and not sums.any()
    again = scratch.get(4, shape, 2, torch.float32, torch.device("cpu"))
    assert again[0] is sums and again[1] is counts  # a graph captured at 1 row reads these
    with pytest.raises(ValueError, match="holds 4 rows, asked for 5"):
        scratch.get(5, shape, 2, torch.float32, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(16, 16), (16, 32)])  # 0.8B/2B, then 4B/9B
@pytest.mark.parametrize("rows", [1, 16, 64])
def test_fused_gdn_layer_matches_at_the_real_shapes(heads, rows, state_dtype):
    """bf16 at the real head layouts, against the unfused kernels the engine ran before (the
    torch references compute the conv in bf16, these in fp32 as the fused kernel does); a
    padding row among the real ones, three steps, with and without PDL; the state in fp32 or
    (gdn_state_dtype=bfloat16) bf16."""
    gen = torch.Generator().manual_seed(rows)
    shape = GdnShape(num_k_heads=heads[0], num_v_heads=heads[1], k_dim=128, v_dim=128)
    weights, conv_pool, state_pool = _case(gen, shape, torch.bfloat16, "cuda", rows + 2,
                                           state_dtype=state_dtype)
    state_tolerance = 1e-5 if state_dtype == torch.float32 else 5e-3
    ref_conv, ref_state = conv_pool.clone(), state_pool.clone()
    scratch = GdnLayerScratch(rows + 1)
    slots = torch.cat([torch.arange(1, rows + 1), torch.zeros(1, dtype=torch.int64)]).cuda()
    for step, pdl in enumerate((False, True, True)):
        projected = torch.randn(rows + 1, sum(shape.split), generator=gen).to("cuda",
                                                                             torch.bfloat16)
        out = gdn_layer_decode(projected, weights, conv_pool, state_pool, slots, scratch,
                               pdl=pdl)
        want = _unfused_kernels(projected[:rows], weights, ref_conv, ref_state, slots[:rows])
        assert _rel_err(out[:rows], want) < 1e-2, f"step {step}"
        assert _rel_err(state_pool, ref_state) < state_tolerance, f"step {step}"
        assert torch.equal(conv_pool[1:], ref_conv[1:]), f"step {step}"
        assert not out[rows].any(), "a padding row's output"
