"""StepBuffers: the fixed-address device buffers every step reads, and their host staging twins.

A captured graph reads its inputs at the addresses it was captured with, so the engine never
hands a forward a fresh tensor: each step's inputs are staged into host arrays (numpy views of
pinned memory on CUDA) and copied into these buffers, whose addresses never change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DecodeInputs:
    """A decode bucket's per-row inputs: views of one [4 * bucket] block (flat[:4 * bucket],
    these four in this order), device or host, so a decode step uploads its rows in one copy."""

    input_ids: torch.Tensor | np.ndarray  # [bucket]
    positions: torch.Tensor | np.ndarray
    kv_write_loc: torch.Tensor | np.ndarray
    state_slots: torch.Tensor | np.ndarray

    @classmethod
    def of(cls, flat, bucket: int) -> DecodeInputs:
        return cls(*(flat[i * bucket:(i + 1) * bucket] for i in range(4)))

    @staticmethod
    def input_ids_of(flat, bucket: int):
        """`of(flat, bucket).input_ids` without building the other three views (a step's
        token ids upload on their own, at launch)."""
        return flat[:bucket]


@dataclass(frozen=True)
class SampledTokens:
    """A step's sampled tokens still on the device, for the next step's token ids when it
    launches before they are read back (plan_ahead=launch)."""

    tokens_gpu: torch.Tensor  # [rows], in the order of index_of
    index_of: dict[str, int]  # request id -> its row in tokens_gpu


class StepBuffers:
    """Fixed-address device buffers a step reads, and their host staging twins (`_gpu` and
    `_cpu` pairs; the host side is a numpy view)."""

    def __init__(self, max_tokens: int, max_rows: int, max_pages: int, device: torch.device):
        pin = device.type == "cuda"

        def pair(*shape: int, dtype=torch.int64) -> tuple[torch.Tensor, np.ndarray]:
            host = torch.zeros(shape, dtype=dtype, pin_memory=pin)
            return torch.zeros(shape, dtype=dtype, device=device), host.numpy()

        # a decode bucket's inputs (DecodeInputs): each bucket reads its own fixed views. The
        # token ids upload from their own host array, at launch, once read back: a step staged
        # ahead writes the block while the last step's ids may still be in flight
        self.decode_gpu, self.decode_cpu = pair(4 * max_rows)
        self.decode_ids_cpu = torch.zeros(max_rows, dtype=torch.int64, pin_memory=pin).numpy()
        # rows whose ids come from the last step's tokens on the device: k destinations then
        # k sources, contiguous
        self.id_rows_gpu, self.id_rows_cpu = pair(2 * max_rows)
        self.id_values_gpu = torch.zeros(max_rows, dtype=torch.int64, device=device)
        # a decode step's rows are 0..b-1, one token each: token rows, query starts and logits
        # rows are all this range, fixed for the step's bucket
        self.arange_gpu = torch.arange(max_rows + 1, device=device)

        # a varlen (prefill or mixed) step's inputs: [tokens] and [rows] arrays
        self.input_ids_gpu, self.input_ids_cpu = pair(max_tokens)
        self.positions_gpu, self.positions_cpu = pair(max_tokens)
        self.token_seq_gpu, self.token_seq_cpu = pair(max_tokens)
        self.kv_write_loc_gpu, self.kv_write_loc_cpu = pair(max_tokens)
        self.query_start_loc_gpu, self.query_start_loc_cpu = pair(max_rows + 1)
        self.state_slots_gpu, self.state_slots_cpu = pair(max_rows)
        self.logits_indices_gpu, self.logits_indices_cpu = pair(max_rows)
        # [rows, max pages]: every step's block-table rows (decode and varlen)
        self.block_tables_gpu, self.block_tables_cpu = pair(max_rows, max_pages,
                                                            dtype=torch.int32)


def copy_all(copies: list[tuple[torch.Tensor, np.ndarray]]) -> None:
    """Queues each (device view, host view) copy, host to device."""
    for device_view, host_view in copies:
        device_view.copy_(torch.from_numpy(host_view), non_blocking=True)
