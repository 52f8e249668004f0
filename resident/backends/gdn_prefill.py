"""GDN prefill over varlen rows of an eager step: the conv on our Triton kernel, the delta rule
with fla-core's chunk kernels around our state pass. (A padded step splits its GDN layers
instead: backends/padded.py, which runs the same `chunked_delta_rule` on its prefill rows.)

The conv (resident/kernels/conv_varlen.py) reads and updates each row's window in its pool slot;
the delta rule's state pass (resident/kernels/chunk_states.py) reads and writes each row's state
in its pool slot, so no layer gathers or scatters states. The chunk table and offsets are built
on the host (model/step.chunk_table) and uploaded once a step: fla derives nothing from
cu_seqlens, so neither its tensor cache (keyed by tensor identity, stale on a padded step's
fixed buffers) nor a device read is ever reached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from resident.kernels.chunk_states import chunk_states
from resident.kernels.conv_varlen import causal_conv_varlen
from resident.kernels.gdn import l2norm
from resident.model.config import ModelConfig
from resident.model.dense import gdn_gates
from resident.model.ops import ModelOps
from resident.model.step import GDN_CHUNK, StepMeta, chunk_counts, chunk_table


def conv_varlen_op(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor,
                   meta: StepMeta, widths: tuple[int, int, int],
                   head_dim: int) -> tuple[torch.Tensor, ...]:
    """The conv with each query and key head l2-normalised: every delta rule op paired with it
    takes them so (l2norm_qk False, fla's use_qk_l2norm_in_kernel off)."""
    return causal_conv_varlen(x, weight, conv_pool, meta.state_slots, meta.query_start_loc,
                              meta.token_seq, widths, head_dim, l2norm_qk=True)


def chunked_delta_rule(query, key, value, log_decay, beta, state_pool: torch.Tensor,
                       slots: torch.Tensor, cu_seqlens: torch.Tensor, chunks: torch.Tensor,
                       chunk_offsets: torch.Tensor, chunk_size: int = GDN_CHUNK) -> torch.Tensor:
    """[T, Hv, Dv]: the chunked gated delta rule over [T, ...] tokens as sequences (tokens
    outside them are left unwritten), sequence n starting from state_pool[slots[n]] and its
    final state written back there. query and key come l2-normalised (conv_varlen_op);
    log_decay [T, Hv] fp32, beta [T, Hv]. The chunk table and offsets (model/step.chunk_table)
    come from the host, so nothing here reads the device or derives an index.

    fla-core's forward (chunk_gated_delta_rule_fwd) piece by piece, its state pass replaced by
    ours (kernels/chunk_states.py), which addresses states by slot: fla's own takes one state a
    sequence, which cost a gather, a zero fill and a scatter of every sequence's state a layer."""
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    # [1, T, heads, dim]: one batch row of sequences, as fla takes varlen input
    q, k, v, b = (t.contiguous().unsqueeze(0) for t in (query, key, value, beta))
    varlen = {"cu_seqlens": cu_seqlens, "chunk_indices": chunks, "chunk_size": chunk_size}
    g = chunk_local_cumsum(log_decay.unsqueeze(0), scale=RCP_LN2, **varlen)
    w, u, _ = chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=b, **varlen)
    h, v_new = chunk_states(k, w, u, g, state_pool, slots, cu_seqlens, chunk_offsets,
                            chunks.shape[0], chunk_size)
    out = chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=g, scale=query.shape[-1] ** -0.5, **varlen)
    return out[0]


@dataclass(frozen=True)
class Sequences:
    """A step's rows as chunked sequences, built on the host from their token bounds and
    uploaded once for all GDN layers (eager steps and the start-up tuning)."""

    cu_seqlens: torch.Tensor  # [N + 1] int64
    chunks: torch.Tensor  # [NT, 2] int64 (model/step.chunk_table)
    chunk_offsets: torch.Tensor  # [N + 1] int64

    @classmethod
    def of(cls, cu_seqlens: np.ndarray, device: torch.device) -> Sequences:
        cu_seqlens = np.ascontiguousarray(cu_seqlens, np.int64)
        table = np.empty((int(chunk_counts(cu_seqlens, GDN_CHUNK).sum()), 2), np.int64)
        offsets = np.empty_like(cu_seqlens)
        chunk_table(cu_seqlens, table, offsets, GDN_CHUNK)
        return cls(*(torch.from_numpy(a).to(device, non_blocking=True)
                     for a in (cu_seqlens, table, offsets)))

    def run(self, query, key, value, log_decay, beta, state_pool: torch.Tensor,
            slots: torch.Tensor) -> torch.Tensor:
        return chunked_delta_rule(query, key, value, log_decay, beta, state_pool, slots,
                                  self.cu_seqlens, self.chunks, self.chunk_offsets)


def tune_chunked_delta_rule(model: ModelConfig, num_tokens: int, dtype: torch.dtype,
                            state_dtype: torch.dtype, device: torch.device,
                            sequence: int = 512) -> None:
    """The chunked delta rule once over num_tokens tokens of random inputs in sequences of
    `sequence` tokens, before any padded step runs. fla's chunk kernels and our state pass
    autotune at their first call, keyed by heads, head dims and dtypes (not the tokens), and the
    padded steps' warm-up would make that call on an all-padding step whose every chunk is
    masked out: the tuning then times empty kernels and picks at random (two H200s picked
    configs 2x apart for the kkt solve, 0.6 ms of a 2,048-token step). With Triton's cache
    kept (the gate keeps it across rounds) the tuners load what they picked and this costs one
    step."""
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device)

    hk, hv = model.linear_num_key_heads, model.linear_num_value_heads
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    query, key = (l2norm(randn(num_tokens, hk, dk)).to(dtype) for _ in range(2))
    value = randn(num_tokens, hv, dv).to(dtype)
    log_decay = -torch.rand(num_tokens, hv, generator=generator, device=device)  # fp32
    beta = torch.rand(num_tokens, hv, generator=generator, device=device).to(dtype)
    sequences = Sequences.of(np.array([*range(0, num_tokens, sequence), num_tokens]), device)
    num_rows = sequences.cu_seqlens.shape[0] - 1
    states = torch.zeros(num_rows + 1, hv, dk, dv, dtype=state_dtype, device=device)
    sequences.run(query, key, value, log_decay, beta, states,
                  torch.arange(1, num_rows + 1, device=device))
    torch.cuda.synchronize(device)


def gdn_prefill_ops(query_start_loc_cpu: np.ndarray, device: torch.device,
                    gates: Callable = gdn_gates) -> ModelOps:
    """The step's GDN ops; `gates` is the model's (compiled) dense.gdn_gates."""
    sequences = Sequences.of(query_start_loc_cpu, device)

    def gated_delta_rule(query, key, value, a, b, a_log, dt_bias, state_pool: torch.Tensor,
                         meta: StepMeta) -> torch.Tensor:
        log_decay, beta = gates(a, b, a_log, dt_bias)
        return sequences.run(query, key, value, log_decay, beta, state_pool, meta.state_slots)

    return ModelOps(conv=conv_varlen_op, gated_delta_rule=gated_delta_rule)
