"""Kernel backends by name; see base.py for the split between prefill and decode kernels."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch

from resident.backends.base import (
    DecodeKernels,
    PrefillKernels,
    PrefillStep,
    StepKernels,
    torch_argmax,
)
from resident.backends.layout import PagedLayout, paged_layout
from resident.config import EngineConfig
from resident.model.config import ModelConfig
from resident.model.dense import gdn_gates
from resident.model.ops import ModelOps, gated_delta_rule_ref_op

if TYPE_CHECKING:  # these import Triton: loaded where used, as the Triton backends are
    from resident.backends.gemv_table import GemvTable, RunsInstead
    from resident.backends.triton_decode import DecodeFusion

log = logging.getLogger("resident.backends")

__all__ = ["DecodeKernels", "PagedLayout", "PrefillKernels", "PrefillStep", "StepKernels",
           "build_kernels", "paged_layout"]


def build_kernels(config: EngineConfig, model: ModelConfig, dtype: torch.dtype,
                  device: torch.device, gates: Callable = gdn_gates) -> StepKernels:
    """The resolved config's prefill kernels (by device) and decode kernels (by
    attention_backend). On CPU, `triton` (allowed only under TRITON_INTERPRET, for tests) runs
    every decode kernel, and the prefill's GDN conv, in the interpreter. On CUDA the GDN conv
    (prefill and decode) and the GDN decode recurrence are Triton's under every backend, and
    `triton` and `flashinfer` run the narrow projections of buckets of at most 16 rows as
    decode_gemm says (triton_decode.decode_gemm_ops), and under fused_decode a GDN layer and an
    attention layer's prologue are one kernel each (triton_decode.DecodeFusion). `gates` is the
    model's dense.gdn_gates, for the prefill GDN op (the decode kernel computes the gates
    itself). Under padded_prefill the padded steps' ops (backends/padded.py) come with them."""
    from resident.backends.padded import padded_ops
    from resident.backends.torch_ref import RefDecode, RefPrefill

    name = config.attention_backend
    padded = (padded_ops(device, name == "triton", gates, config.varlen_splits == "auto")
              if config.padded_prefill == "on" else None)
    kernels = partial(StepKernels, padded=padded, argmax=_argmax(config, device))
    if device.type != "cuda":
        if name != "triton":
            return kernels(RefPrefill(), RefDecode())
        from resident.backends.gdn_prefill import conv_varlen_op
        from resident.backends.triton_decode import TritonDecode
        # the varlen conv l2-normalises query and key: the reference delta rule takes them so
        prefill = RefPrefill(ModelOps(conv=conv_varlen_op, gated_delta_rule=partial(
            gated_delta_rule_ref_op, l2norm_qk=False)))
        fusion, table = _fusion_and_table(config, model, dtype, device)
        return kernels(prefill, TritonDecode(config.decode_buckets, config.decode_gemm, fusion,
                                             table, _attention_sms(config, model, device)))

    from resident.backends.flashinfer import (
        FlashInferDecode,
        FlashInferPrefill,
        HeadShape,
        flashinfer_workspace,
    )
    from resident.backends.triton_decode import GDN_DECODE_OPS, TritonDecode

    heads = HeadShape.of(model, config.page_size, dtype)
    workspace = flashinfer_workspace(device)
    prefill = FlashInferPrefill(heads, workspace, gates, lazy=padded is not None)
    if name == "flashinfer":
        max_pages = -(-config.max_model_len // config.page_size)
        fusion, table = _fusion_and_table(config, model, dtype, device)
        decode = FlashInferDecode(heads, workspace, config.decode_buckets, max_pages,
                                  config.decode_gemm, fusion, table)
    elif name == "triton":
        fusion, table = _fusion_and_table(config, model, dtype, device)
        decode = TritonDecode(config.decode_buckets, config.decode_gemm, fusion, table,
                              _attention_sms(config, model, device))
    else:
        decode = RefDecode(GDN_DECODE_OPS)  # the torch reference, for checks: cuBLAS GEMMs
    return kernels(prefill, decode)


def _argmax(config: EngineConfig, device: torch.device) -> Callable:
    """The argmax knob's greedy-token op: torch's, or the Triton rows kernel (with PDL where
    the decode step's kernels have it)."""
    if config.argmax == "torch":
        return torch_argmax
    from resident.kernels.argmax import RowsArgmax
    from resident.kernels.pdl import pdl_on

    return RowsArgmax(pdl=pdl_on(config.pdl, device))


def _attention_sms(config: EngineConfig, model: ModelConfig, device: torch.device) -> int:
    """The SMs the Triton decode attention sizes its key splits and tile by
    (decode_splits=auto), 0 under off (8 splits of the kernel's own tile in every bucket);
    each bucket's splits x keys a tile logged."""
    from resident.kernels import device_sms
    from resident.kernels.decode_attention import DEFAULT_DECODE_SPLITS, decode_tile

    if config.decode_splits != "auto":
        log.info("decode attention (triton): %d key splits of the kernel's own tile in every "
                 "bucket (decode_splits=off)", DEFAULT_DECODE_SPLITS)
        return 0
    num_sms = device_sms(device)
    tiles = ", ".join(
        "{}: {}x{}".format(bucket, *decode_tile(bucket, model.num_key_value_heads, num_sms,
                                                model.head_dim))
        for bucket in config.decode_buckets)
    log.info("decode attention (triton), bucket: key splits x keys a tile: %s "
             "(decode_splits=auto, %d SMs)", tiles, num_sms)
    return num_sms


def _fusion_and_table(config: EngineConfig, model: ModelConfig, dtype: torch.dtype,
                      device: torch.device) -> tuple[DecodeFusion, GemvTable | None]:
    """What the Triton and FlashInfer decode backends share: the fused_decode and pdl knobs'
    DecodeFusion on this device, and the gemv_table knob's table, logged with the kernel the
    fusion runs in a table entry's place."""
    from resident.backends.triton_decode import DecodeFusion

    gate_up_shape = model.decode_projections["mlp gate_up"]
    fusion = DecodeFusion.of(config.fused_decode, config.pdl, device,
                             math.prod(gate_up_shape) * dtype.itemsize, model.hidden_size)
    log.info("decode: %s", fusion.describe())
    return fusion, _gemv_table(config, device, fusion.table_note(gate_up_shape))


def _gemv_table(config: EngineConfig, device: torch.device, runs_instead: RunsInstead):
    """The gemv_table knob's measured table (logged, with runs_instead's kernels where the
    engine runs one in place of the table's: GemvTable.describe), or None: `auto` reads the
    one committed for this GPU (gemv_table.shipped_table_path), on CUDA under decode_gemm
    skinny or wide."""
    from resident.backends.gemv_table import GemvTable, log_table, shipped_table_path

    path = config.gemv_table
    if path == "auto":
        if device.type != "cuda" or config.decode_gemm not in ("skinny", "wide"):
            return None
        shipped = shipped_table_path(torch.cuda.get_device_name(device))
        if not shipped.is_file():
            log.info("no measured gemv table for this GPU (%s): decode_gemm's rule", shipped)
            return None
        path = str(shipped)
    if path == "off":
        return None
    table = GemvTable.load(path)
    log_table(table, config.decode_buckets, runs_instead)
    return table
