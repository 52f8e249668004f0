"""GDN prefill over varlen rows of an eager step: the conv on our Triton kernel, the delta rule
with fla-core. (A padded step splits its GDN layers instead: backends/padded.py.)

The conv (resident/kernels/conv_varlen.py) reads and updates each row's window in its pool slot.
fla's `chunk_gated_delta_rule` takes one state per row ([N, ...]) rather than a slot-indexed
pool, so each layer gathers its rows' states from the pool, runs, and scatters the final states
back (prefill steps are eager, so the gather's copy is allowed here). `cu_seqlens` is a fresh
device tensor every step, with its host twin beside it so fla computes its chunk indices without
reading the device. fla caches what it derives from cu_seqlens by tensor identity, so a padded
step's fixed cu_seqlens buffer would hit a stale entry: `chunked_delta_rule` turns that cache
off (a fresh tensor every eager step never hit it anyway).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from resident.kernels.conv_varlen import causal_conv_varlen
from resident.kernels.gdn import l2norm
from resident.model.config import ModelConfig
from resident.model.dense import gdn_gates
from resident.model.ops import ModelOps
from resident.model.step import StepMeta


def conv_varlen_op(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor,
                   meta: StepMeta, widths: tuple[int, int, int],
                   head_dim: int) -> tuple[torch.Tensor, ...]:
    """The conv with each query and key head l2-normalised: every delta rule op paired with it
    takes them so (l2norm_qk False, fla's use_qk_l2norm_in_kernel off)."""
    return causal_conv_varlen(x, weight, conv_pool, meta.state_slots, meta.query_start_loc,
                              meta.token_seq, widths, head_dim, l2norm_qk=True)


def chunked_delta_rule(query, key, value, log_decay, beta, state_pool: torch.Tensor,
                       slots: torch.Tensor, **varlen) -> torch.Tensor:
    """fla's chunk_gated_delta_rule over [T, ...] tokens as one batch row of sequences,
    sequence i's state gathered from pool slot slots[i] and its final state written back; query
    and key come l2-normalised (conv_varlen_op); `varlen` is fla's cu_seqlens with its host
    twin (cu_seqlens_cpu) or its chunk table (chunk_indices)."""
    import fla.utils
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    fla.utils.FLA_DISABLE_TENSOR_CACHE = True
    out, final = chunk_gated_delta_rule(
        query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0), log_decay.unsqueeze(0),
        beta.unsqueeze(0), scale=query.shape[-1] ** -0.5,
        initial_state=state_pool[slots],  # [N, Hv, Dk, Dv]
        output_final_state=True, use_qk_l2norm_in_kernel=False, **varlen)
    # index_copy_ rather than index_put: 20 us against 27 for 17 slots of 1 MB on the H200
    state_pool.index_copy_(0, slots, final.to(state_pool.dtype))
    return out[0]


def tune_chunked_delta_rule(model: ModelConfig, num_tokens: int, dtype: torch.dtype,
                            state_dtype: torch.dtype, device: torch.device,
                            sequence: int = 512) -> None:
    """fla's chunked delta rule once over num_tokens tokens of random inputs in sequences of
    `sequence` tokens, before any padded step runs. fla autotunes each of its kernels at the
    first call, keyed by heads, head dims and dtypes (not the tokens), and the padded steps'
    warm-up would make that call on an all-padding step whose every chunk is masked out: the
    tuning then times empty kernels and picks at random (two H200s picked configs 2x apart for
    the kkt solve, 0.6 ms of a 2,048-token step). With Triton's cache kept (the gate keeps it
    across rounds) fla loads what it tuned and this costs one step."""
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device)

    hk, hv = model.linear_num_key_heads, model.linear_num_value_heads
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    query, key = (l2norm(randn(num_tokens, hk, dk)).to(dtype) for _ in range(2))
    value = randn(num_tokens, hv, dv).to(dtype)
    log_decay = -torch.rand(num_tokens, hv, generator=generator, device=device)  # fp32
    beta = torch.rand(num_tokens, hv, generator=generator, device=device).to(dtype)
    cu_seqlens_cpu = torch.tensor([*range(0, num_tokens, sequence), num_tokens])
    num_rows = len(cu_seqlens_cpu) - 1
    states = torch.zeros(num_rows + 1, hv, dk, dv, dtype=state_dtype, device=device)
    chunked_delta_rule(query, key, value, log_decay, beta, states,
                       torch.arange(1, num_rows + 1, device=device),
                       cu_seqlens=cu_seqlens_cpu.to(device), cu_seqlens_cpu=cu_seqlens_cpu)
    torch.cuda.synchronize(device)


def gdn_prefill_ops(query_start_loc_cpu: np.ndarray, device: torch.device,
                    gates: Callable = gdn_gates) -> ModelOps:
    """The step's GDN ops; `gates` is the model's (compiled) dense.gdn_gates."""
    cu_seqlens_cpu = torch.from_numpy(np.ascontiguousarray(query_start_loc_cpu, np.int64))
    cu_seqlens = cu_seqlens_cpu.to(device, non_blocking=True)

    def gated_delta_rule(query, key, value, a, b, a_log, dt_bias, state_pool: torch.Tensor,
                         meta: StepMeta) -> torch.Tensor:
        log_decay, beta = gates(a, b, a_log, dt_bias)
        return chunked_delta_rule(query, key, value, log_decay, beta, state_pool,
                                  meta.state_slots, cu_seqlens=cu_seqlens,
                                  cu_seqlens_cpu=cu_seqlens_cpu)

    return ModelOps(conv=conv_varlen_op, gated_delta_rule=gated_delta_rule)
