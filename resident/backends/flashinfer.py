"""FlashInfer fa2 kernels: paged prefill for varlen steps, and paged decode for the `flashinfer`
decode backend.

Both plan on the host: the plan reads each row's page count and last-page length from host
tensors and writes the schedule into the wrapper's buffers. A decode bucket's wrapper is built
with `use_cuda_graph`, so its buffers never move and a captured graph replays its `run` after a
`plan`. A decode step whose page lists equal the bucket's last plan's (no row changed and none
crossed a page) skips the plan and writes only the last-page lengths (layout.PlanReuse says why
that is exact); at high concurrency some row crosses a page nearly every step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from resident.backends.base import DecodeKernels, PrefillKernels, PrefillStep
from resident.backends.gdn_prefill import gdn_prefill_ops
from resident.backends.gemv_table import GemvTable
from resident.backends.layout import PagedLayout, PlanReuse
from resident.backends.triton_decode import (
    GDN_DECODE_OPS,
    DecodeFusion,
    decode_gemm_ops,
    write_kv_triton_op,
)
from resident.model.config import ModelConfig
from resident.model.dense import gdn_gates
from resident.model.ops import ModelOps

WORKSPACE_BYTES = 128 * 2**20


def _import_flashinfer():
    try:
        import flashinfer
    except ImportError as err:
        raise RuntimeError(f"FlashInfer is needed on CUDA (prefill, and attention_backend="
                           f"flashinfer) but does not import: {err}; install "
                           f"flashinfer-python (the gpu extra)") from None
    return flashinfer


@dataclasses.dataclass(frozen=True)
class HeadShape:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype

    @classmethod
    def of(cls, model: ModelConfig, page_size: int, dtype: torch.dtype) -> HeadShape:
        return cls(model.num_attention_heads, model.num_key_value_heads, model.head_dim,
                   page_size, dtype)

    def plan_args(self, layout: PagedLayout) -> tuple:
        return (layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len,
                self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)

    def plan_kwargs(self) -> dict:
        return {"q_data_type": self.dtype, "kv_data_type": self.dtype,
                "sm_scale": self.head_dim**-0.5}


def _run(wrapper):
    def attention(query, kv_layer, meta, scale):
        return wrapper.run(query.contiguous(), kv_layer)
    return attention


class FlashInferPrefill(PrefillKernels):
    """FlashInfer causal paged prefill for attention; GDN as gdn_prefill runs it (our varlen
    conv, fla's chunked delta rule)."""

    needs_layout = True

    def __init__(self, heads: HeadShape, workspace: torch.Tensor,
                 gates: Callable = gdn_gates, lazy: bool = False) -> None:
        """gates: the model's (compiled) dense.gdn_gates, for fla's delta rule. lazy: FlashInfer
        is imported and its wrapper made at the first eager step, not here (under
        padded_prefill every step fits a bucket and none is eager: start-up skips the import);
        otherwise a FlashInfer that does not import fails here, at start-up."""
        self.heads, self.workspace, self.device, self.gates = (heads, workspace,
                                                              workspace.device, gates)
        self._wrapper = None if lazy else self._make_wrapper()

    @property
    def wrapper(self):
        if self._wrapper is None:
            self._wrapper = self._make_wrapper()
        return self._wrapper

    def _make_wrapper(self):
        return _import_flashinfer().BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                                        backend="fa2")

    def ops(self, step: PrefillStep) -> ModelOps:
        layout = step.layout
        self.wrapper.plan(layout.qo_indptr, *self.heads.plan_args(layout), causal=True,
                          **self.heads.plan_kwargs())
        gdn = gdn_prefill_ops(step.query_start_loc_cpu, self.device, self.gates)
        return dataclasses.replace(gdn, write_kv=write_kv_triton_op,
                                   attention=_run(self.wrapper))


class FlashInferDecode(DecodeKernels):
    """fa2 paged decode on CUDA cores, one graph-safe wrapper per bucket."""

    name = "flashinfer"
    host_plan = True

    def __init__(self, heads: HeadShape, workspace: torch.Tensor, buckets: tuple[int, ...],
                 max_pages_per_row: int, decode_gemm: str = "skinny",
                 fusion: DecodeFusion | None = None, table: GemvTable | None = None) -> None:
        flashinfer = _import_flashinfer()
        device = workspace.device
        self.heads = heads
        self.wrappers, self._ops, self._last_page_len = {}, {}, {}
        # one stage for every bucket: a step plans one bucket, and plan() copies from the stage
        # into that bucket's own buffers, in stream order
        widest = max(buckets)
        num_indices = widest * max_pages_per_row
        self._indices_gpu = torch.zeros(num_indices, dtype=torch.int32, device=device)
        self._indices_cpu = torch.zeros(num_indices, dtype=torch.int32, pin_memory=True)
        self._indptr_cpu = torch.zeros(widest + 1, dtype=torch.int32, pin_memory=True)
        self._last_page_len_cpu = torch.zeros(widest, dtype=torch.int32, pin_memory=True)
        self.reuse = PlanReuse()
        self.num_plans_reused = 0
        fusion = fusion or DecodeFusion()
        fused = fusion.bucket_ops(GDN_DECODE_OPS, buckets)
        for bucket in buckets:
            def int_buffer(size: int) -> torch.Tensor:
                return torch.zeros(size, dtype=torch.int32, device=device)

            # the graph-mode wrapper keeps these buffers and plans into them
            self._last_page_len[bucket] = int_buffer(bucket)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_cuda_graph=True, use_tensor_cores=False,
                paged_kv_indptr_buffer=int_buffer(bucket + 1),
                paged_kv_indices_buffer=int_buffer(bucket * max_pages_per_row),
                paged_kv_last_page_len_buffer=self._last_page_len[bucket], backend="fa2")
            self.wrappers[bucket] = wrapper
            ops = dataclasses.replace(fused[bucket], attention=_run(wrapper))
            self._ops[bucket] = decode_gemm_ops(ops, bucket, decode_gemm, fusion, table)
        self.gemv_table = table and table.source

    def ops(self, bucket: int) -> ModelOps:
        return self._ops[bucket]

    def plan_decode(self, bucket: int, layout: PagedLayout) -> None:
        # Every host tensor reaches the device from a pinned stage: a copy from pageable memory
        # costs the host a staging copy each (the H200 profile: two a step), and a graph-mode
        # wrapper copies host page indices with a blocking copy, a stream sync that makes the
        # host wait for the step in flight (1.25 ms a re-plan at c=64), so those go to the
        # device first and plan() copies them device to device. The stages are free again once
        # the read-back that follows this step's uploads returns (Engine._launch).
        last_page_len = _staged(self._last_page_len_cpu, layout.kv_last_page_len)
        if self.reuse.reusable(bucket, layout):
            self._last_page_len[bucket].copy_(last_page_len, non_blocking=True)
            self.num_plans_reused += 1
            return
        indices = self._indices_gpu[:len(layout.kv_indices)]
        indices.copy_(_staged(self._indices_cpu, layout.kv_indices), non_blocking=True)
        staged = dataclasses.replace(layout, kv_indptr=_staged(self._indptr_cpu, layout.kv_indptr),
                                     kv_indices=indices, kv_last_page_len=last_page_len)
        self.wrappers[bucket].plan(*self.heads.plan_args(staged), **self.heads.plan_kwargs())
        self.reuse.planned(bucket, layout)


def _staged(stage_cpu: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    """`host` copied into the front of a pinned stage (a host copy: no device work)."""
    staged = stage_cpu[:len(host)]
    staged.copy_(host)
    return staged


def flashinfer_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
