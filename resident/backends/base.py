"""Kernel backends: which kernels each kind of step runs, and the host work they need first.

A step's kernels come in two halves, chosen separately:
  - prefill and mixed steps (varlen rows): under `padded_prefill`, the padded ops
    (backends/padded.py), fixed for every bucket and captured; otherwise `PrefillKernels`, by
    device: the torch references on CPU, FlashInfer paged prefill and fla's chunked GDN on
    CUDA, planned on the host each step;
  - decode buckets (one token a row, fixed shapes, captured in CUDA graphs): `DecodeKernels`, by
    the `attention_backend` knob. A decode backend that needs a host plan (`host_plan`) gets one
    from `plan_decode` before every replay of the bucket; one that reads block tables and lengths
    on the device needs none.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from resident.backends.layout import PagedLayout
from resident.model.ops import ModelOps


@dataclass(frozen=True)
class PrefillStep:
    """Host facts about a varlen step that a prefill backend may plan from."""

    query_start_loc_cpu: np.ndarray  # [B+1] int64
    layout: PagedLayout | None  # only built when `PrefillKernels.needs_layout`


class PrefillKernels(ABC):
    needs_layout: bool = False

    @abstractmethod
    def ops(self, step: PrefillStep) -> ModelOps:
        """The step's ops, planned for it; valid until the next call."""


class DecodeKernels(ABC):
    name: str
    host_plan: bool = False
    gemv_table: str | None = None  # the measured table its projections follow (gemv_table.py)

    @abstractmethod
    def ops(self, bucket: int) -> ModelOps:
        """The bucket's ops; the same object (and buffers) every time, so a graph can hold it."""

    def plan_decode(self, bucket: int, layout: PagedLayout) -> None:
        """Host plan of the bucket's next replay; nothing for backends that read on device."""
        del bucket, layout


def torch_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[rows] int64: each row's argmax of [rows, vocab] logits (the argmax knob's `torch`)."""
    return logits.argmax(dim=-1)


@dataclass(frozen=True)
class StepKernels:
    prefill: PrefillKernels  # eager varlen steps
    decode: DecodeKernels
    padded: ModelOps | None = None  # padded varlen steps (padded_prefill on)
    # each row's greedy token of [rows, vocab] logits (knob argmax; kernels/argmax.py)
    argmax: Callable[[torch.Tensor], torch.Tensor] = torch_argmax
