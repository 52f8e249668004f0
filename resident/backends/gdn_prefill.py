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


def _chunked_delta_rule(query, key, value, log_decay, beta, state_pool: torch.Tensor,
                        meta: StepMeta, **varlen) -> torch.Tensor:
    """fla's chunk_gated_delta_rule over the step's tokens as one batch row ([T, ...] in and
    out), each row's state gathered from its pool slot and the final one written back;
    `varlen` is fla's cu_seqlens pair, or nothing for one fixed-length row."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    out, final = chunk_gated_delta_rule(
        query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0), log_decay.unsqueeze(0),
        beta.unsqueeze(0), scale=query.shape[-1] ** -0.5,
        initial_state=state_pool[meta.state_slots],  # [B, Hv, Dk, Dv]
        output_final_state=True, use_qk_l2norm_in_kernel=True, **varlen)
    state_pool[meta.state_slots] = final.to(state_pool.dtype)
    return out[0]


def gdn_prefill_ops(query_start_loc_cpu: np.ndarray, device: torch.device,
                    gates: Callable = gdn_gates) -> ModelOps:
    """The step's GDN ops; `gates` is the model's (compiled) dense.gdn_gates."""
    cu_seqlens_cpu = torch.from_numpy(np.ascontiguousarray(query_start_loc_cpu, np.int64))
    cu_seqlens = cu_seqlens_cpu.to(device, non_blocking=True)

    def gated_delta_rule(query, key, value, a, b, a_log, dt_bias, state_pool: torch.Tensor,
                         meta: StepMeta) -> torch.Tensor:
        log_decay, beta = gates(a, b, a_log, dt_bias)
        return _chunked_delta_rule(query, key, value, log_decay, beta, state_pool, meta,
                                   cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)

    return ModelOps(conv=conv_varlen_op, gated_delta_rule=gated_delta_rule)


def fresh_gdn_ops(gates: Callable = gdn_gates) -> ModelOps:
    """GDN ops of a fresh prefill bucket: one row, query_start_loc [0, n], padded to the
    bucket's T tokens. fla runs its fixed-length path over all T (chunk indices come from the
    shape, so nothing is read on the host and the launches can be captured). The padding
    tokens get decay 0 and beta 0, which leave the state as the row's last token left it, so
    the final state fla returns is the row's; the conv reads the row's end from the device."""

    def gated_delta_rule(query, key, value, a, b, a_log, dt_bias, state_pool: torch.Tensor,
                         meta: StepMeta) -> torch.Tensor:
        log_decay, beta = gates(a, b, a_log, dt_bias)  # [T, Hv] each
        in_row = (torch.arange(query.shape[0], device=query.device)
                  < meta.query_start_loc[-1])[:, None]  # [T, 1]
        return _chunked_delta_rule(query, key, value, torch.where(in_row, log_decay, 0.0),
                                   torch.where(in_row, beta, 0.0), state_pool, meta)

    return ModelOps(conv=conv_varlen_op, gated_delta_rule=gated_delta_rule)
