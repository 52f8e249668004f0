"""The kernels of padded prefill and mixed steps (`padded_prefill`, engine/varlen.py): fixed
shapes, no host plan, everything they need read from the StepMeta's fixed buffers, so one
ModelOps serves every bucket and each bucket's launches can be captured.

- attention: the Triton varlen paged kernel (kernels/varlen_attention.py), whose grid is the
  bucket's tokens and rows; padding rows and tokens cost a program that returns;
- conv: the Triton varlen conv, in place on the slot pool (padding rows are zero-length), query
  and key heads l2-normalised there, so neither half of the GDN split normalises them again;
- GDN: split (model/step.GdnSplit). First the chunked delta rule over the prefill rows as
  sequences (gdn_prefill.chunked_delta_rule: fla's chunk kernels around our state pass, fed the
  chunk table and offsets the host built, so nothing reads the host or derives an index), each
  sequence's state read from and written back to its slot in place; then the decode rows step in
  place by slot with the decode kernel, whose outputs replace the first sequence's (the decode
  tokens, run there on the sink only to keep fla's sequences contiguous from token 0). Padding
  decode entries sit on the sink slot and the kernel skips them.

On CPU the same split runs on the torch references (fla has no CPU path), and under the `triton`
backend (in the interpreter, for tests) on the Triton kernels where they have no fla in them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from resident.kernels.gdn import gated_delta_rule_ref
from resident.model.dense import gdn_gates
from resident.model.ops import ModelOps, attention_ref_op
from resident.model.step import GdnSplit, StepMeta

SINK_SLOT = 0  # resources/recurrent.py: padding entries' state slot


def varlen_attention_op(query, kv_layer, meta: StepMeta, scale: float, *,
                        meeting=None, num_sms: int = 0) -> torch.Tensor:
    """The paged varlen attention; given a `meeting` (varlen_splits=auto), each query block's
    keys split over as many programs as varlen_attention.splits_for gives the bucket's grid
    on num_sms SMs (a bucket's shape is fixed, so each bucket's graph holds one count)."""
    from resident.kernels.varlen_attention import paged_varlen_attention, splits_for

    num_splits = 1 if meeting is None else splits_for(
        query.shape[0], meta.block_tables.shape[0], kv_layer.shape[3], num_sms)
    return paged_varlen_attention(query, kv_layer, meta.block_tables, meta.query_start_loc,
                                  meta.positions, scale, num_splits=num_splits,
                                  meeting=meeting)


def split_varlen_attention_op(device: torch.device) -> Callable:
    """varlen_attention_op with split keys (varlen_splits=auto): its scratch and counters
    kept for the captured graphs, the rule sized by the device's SMs."""
    from resident.kernels import device_sms
    from resident.kernels.gdc import KeptZeros

    return partial(varlen_attention_op, meeting=KeptZeros(), num_sms=device_sms(device))


def fla_sequences(query, key, value, log_decay, beta, state_pool: torch.Tensor,
                  split: GdnSplit) -> torch.Tensor:
    """[T, Hv, Dv]: the chunked delta rule (fla's chunk kernels, our state pass) over the
    split's sequences (tokens outside them are left unwritten), each sequence's state read from
    and written back to its slot."""
    from resident.backends.gdn_prefill import chunked_delta_rule

    return chunked_delta_rule(query, key, value, log_decay, beta, state_pool, split.slots,
                              split.cu_seqlens, split.chunks, split.chunk_offsets,
                              split.chunk_size)


def ref_sequences(query, key, value, log_decay, beta, state_pool: torch.Tensor,
                  split: GdnSplit, *, l2norm_qk: bool = True) -> torch.Tensor:
    """The same on the torch reference (reads the longest sequence on the host: CPU only);
    l2norm_qk False after the varlen conv, which normalised query and key."""
    cu = split.cu_seqlens
    longest = max(int((cu[1:] - cu[:-1]).max()), 1)
    return gated_delta_rule_ref(query, key, value, log_decay, beta, state_pool, split.slots,
                                cu, longest, l2norm_qk=l2norm_qk)


def triton_decode_rows(query, key, value, a, b, a_log, dt_bias, log_decay, beta,
                       state_pool: torch.Tensor, split: GdnSplit, out: torch.Tensor) -> None:
    """The decode kernel over the split's decode rows, writing their outputs into out[:D]
    (rows on the sink skipped: their tokens keep what out held); query and key come
    l2-normalised from the varlen conv."""
    from resident.kernels.gdn_decode import gated_delta_rule_decode

    rows = split.decode_slots.shape[0]
    if not rows:  # a prefill bucket
        return
    gated_delta_rule_decode(query[:rows], key[:rows], value[:rows], a[:rows], b[:rows],
                            state_pool, split.decode_slots, split.decode_slots, 1,
                            out=out[:rows], gate_params=(a_log, dt_bias), l2norm_qk=False)


def ref_decode_rows(query, key, value, a, b, a_log, dt_bias, log_decay, beta,
                    state_pool: torch.Tensor, split: GdnSplit, out: torch.Tensor) -> None:
    """The same on the reference: every entry steps (the sink's state takes the padding's
    garbage), and only the real rows' outputs are kept."""
    rows = split.decode_slots.shape[0]
    if not rows:  # a prefill bucket
        return
    starts = torch.arange(rows + 1, device=query.device)
    stepped = gated_delta_rule_ref(query[:rows], key[:rows], value[:rows], log_decay[:rows],
                                   beta[:rows], state_pool, split.decode_slots, starts, 1)
    real = (split.decode_slots != SINK_SLOT)[:, None, None]
    out[:rows] = torch.where(real, stepped, out[:rows])


def split_gdn_op(sequences: Callable, decode_rows: Callable,
                 gates: Callable = gdn_gates) -> Callable:
    """The padded step's GDN op: `sequences` over the prefill rows, then `decode_rows`."""

    def gated_delta_rule(query, key, value, a, b, a_log, dt_bias, state_pool: torch.Tensor,
                         meta: StepMeta) -> torch.Tensor:
        split = meta.gdn_split
        log_decay, beta = gates(a, b, a_log, dt_bias)
        out = sequences(query, key, value, log_decay, beta, state_pool, split)
        decode_rows(query, key, value, a, b, a_log, dt_bias, log_decay, beta, state_pool, split,
                    out)
        return out

    return gated_delta_rule


def padded_ops(device: torch.device, triton: bool, gates: Callable = gdn_gates,
               split_keys: bool = False) -> ModelOps:
    """The padded step's ops: on CUDA the Triton kernels and fla; on CPU the references, or
    (triton, in the interpreter) the Triton kernels but for fla's part. split_keys: the
    attention's keys split over programs (varlen_splits=auto)."""
    on_cuda = device.type == "cuda"
    if not (on_cuda or triton):
        return ModelOps(attention=attention_ref_op,
                        gated_delta_rule=split_gdn_op(ref_sequences, ref_decode_rows, gates))
    from resident.backends.gdn_prefill import conv_varlen_op

    sequences = fla_sequences if on_cuda else partial(ref_sequences, l2norm_qk=False)
    attention = split_varlen_attention_op(device) if split_keys else varlen_attention_op
    ops = ModelOps(attention=attention, conv=conv_varlen_op,
                   gated_delta_rule=split_gdn_op(sequences, triton_decode_rows, gates))
    if on_cuda:
        from resident.backends.triton_decode import write_kv_triton_op

        ops = ModelOps(write_kv=write_kv_triton_op, attention=ops.attention, conv=ops.conv,
                       gated_delta_rule=ops.gated_delta_rule)
    return ops
