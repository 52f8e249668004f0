"""GDN prefill over varlen rows: the conv on our Triton kernel, the delta rule with fla-core.
A fresh prefill bucket (one row, padded) runs fla's fixed-length path instead: see
`fresh_gdn_ops`.

The conv (resident/kernels/conv_varlen.py) reads and updates each row's window in its pool slot.
fla's `chunk_gated_delta_rule` takes one state per row ([N, ...]) rather than a slot-indexed
pool, so each layer gathers its rows' states from the pool, runs, and scatters the final states
back (prefill steps are eager, so the gather's copy is allowed here). `cu_seqlens` is a fresh
device tensor every step, with its host twin beside it so fla computes its chunk indices without
reading the device: fla caches those by tensor identity, and a reused buffer with new contents
would hit a stale entry.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from resident.kernels.conv_varlen import causal_conv_varlen
from resident.model.dense import gdn_gates
from resident.model.ops import ModelOps
from resident.model.step import StepMeta


def conv_varlen_op(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor,
                   meta: StepMeta) -> torch.Tensor:
    return causal_conv_varlen(x, weight, conv_pool, meta.state_slots, meta.query_start_loc,
                              meta.token_seq)


def gdn_prefill_ops(query_start_loc_cpu: np.ndarray, device: torch.device,
                    gates: Callable = gdn_gates) -> ModelOps:
    """The step's GDN ops; `gates` is the model's (compiled) dense.gdn_gates."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    cu_seqlens_cpu = torch.from_numpy(np.ascontiguousarray(query_start_loc_cpu, np.int64))
    cu_seqlens = cu_seqlens_cpu.to(device, non_blocking=True)

    def gated_delta_rule(query, key, value, a, b, a_log, dt_bias, state_pool: torch.Tensor,
                         meta: StepMeta) -> torch.Tensor:
        log_decay, beta = gates(a, b, a_log, dt_bias)
        initial = state_pool[meta.state_slots]  # [B, Hv, Dk, Dv]
        out, final = chunk_gated_delta_rule(
            query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0), log_decay.unsqueeze(0),
            beta.unsqueeze(0), scale=query.shape[-1] ** -0.5, initial_state=initial,
            output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens,
            cu_seqlens_cpu=cu_seqlens_cpu)
        state_pool[meta.state_slots] = final.to(state_pool.dtype)
        return out[0]

    return ModelOps(conv=conv_varlen_op, gated_delta_rule=gated_delta_rule)


def fresh_gdn_ops(gates: Callable = gdn_gates) -> ModelOps:
    """GDN ops of a fresh prefill bucket: one row, query_start_loc [0, n], padded to the
    bucket's T tokens. fla runs its fixed-length path over all T (chunk indices come from the
    shape, so nothing is read on the host and the launches can be captured). The padding
    tokens get decay 0 and beta 0, which leave the state as the row's last token left it, so
    the final state fla returns is the row's; the conv reads the row's end from the device."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    def gated_delta_rule(query, key, value, a, b, a_log, dt_bias, state_pool: torch.Tensor,
                         meta: StepMeta) -> torch.Tensor:
        log_decay, beta = gates(a, b, a_log, dt_bias)  # [T, Hv] each
        in_row = (torch.arange(query.shape[0], device=query.device)
                  < meta.query_start_loc[-1])[:, None]  # [T, 1]
        log_decay = torch.where(in_row, log_decay, 0.0)
        beta = torch.where(in_row, beta, 0.0)
        out, final = chunk_gated_delta_rule(
            query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0), log_decay.unsqueeze(0),
            beta.unsqueeze(0), scale=query.shape[-1] ** -0.5,
            initial_state=state_pool[meta.state_slots], output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        state_pool[meta.state_slots] = final.to(state_pool.dtype)
        return out[0]

    return ModelOps(conv=conv_varlen_op, gated_delta_rule=gated_delta_rule)
