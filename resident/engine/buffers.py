"""StepBuffers: the fixed-address device buffers every step reads, and their host staging twins.

A captured graph reads its inputs at the addresses it was captured with, so the engine never
hands a forward a fresh tensor: each step's inputs are staged into host arrays (numpy views of
pinned memory on CUDA) and copied into these buffers, whose addresses never change.

The host side is a ring of two (`HostStaging`): under `plan_ahead` a step is staged while the
copies of the step before it may still be queued, and a step's host arrays are only reused two
steps later, after the step's wait on the GPU (its read-back, or for a step that samples no
row the same event alone) that the stream orders behind their copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from resident.engine.scheduler import Row


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


@dataclass(frozen=True)
class Capacity:
    """The sizes every buffer is allocated for."""

    max_tokens: int  # a step's tokens
    max_rows: int  # a step's rows
    max_pages: int  # block-table columns
    max_prefill_rows: int  # a padded step's prefill rows (its GDN sequences, less one)
    max_chunks: int  # a padded step's GDN chunks


_INT_ARRAYS = {
    # a decode bucket's inputs (DecodeInputs): each bucket reads its own fixed views
    "decode": lambda c: 4 * c.max_rows,
    # a decode step's token ids upload from their own array, at launch, once read back
    "decode_ids": lambda c: c.max_rows,
    # rows whose ids come from the last step's tokens on the device: k destinations then k
    # sources, contiguous
    "id_rows": lambda c: 2 * c.max_rows,
    # the same for a varlen step's decode rows, staged with its rows (the `step` turn)
    "varlen_id_rows": lambda c: 2 * c.max_rows,
    # a varlen (prefill or mixed) step's [tokens] and [rows] arrays
    "input_ids": lambda c: c.max_tokens,
    "positions": lambda c: c.max_tokens,
    "token_seq": lambda c: c.max_tokens,
    "kv_write_loc": lambda c: c.max_tokens,
    "query_start_loc": lambda c: c.max_rows + 1,
    "state_slots": lambda c: c.max_rows,
    "logits_indices": lambda c: c.max_rows,
    # a padded step's GDN split (model/step.GdnSplit)
    "decode_slots": lambda c: c.max_rows,
    "gdn_cu_seqlens": lambda c: c.max_prefill_rows + 2,
    "gdn_slots": lambda c: c.max_prefill_rows + 1,
    "gdn_chunks": lambda c: 2 * c.max_chunks,
    "gdn_chunk_offsets": lambda c: c.max_prefill_rows + 2,
}


# a varlen step's arrays: consecutive in _INT_ARRAYS, so one span of the flat arrays
VARLEN_ARRAYS = ("input_ids", "positions", "token_seq", "kv_write_loc", "query_start_loc",
                 "state_slots", "logits_indices", "decode_slots", "gdn_cu_seqlens", "gdn_slots",
                 "gdn_chunks", "gdn_chunk_offsets")


def int_layout(capacity: Capacity) -> dict[str, slice]:
    """Each int array's place in one flat int64 array, in _INT_ARRAYS' order."""
    places, start = {}, 0
    for name, size in _INT_ARRAYS.items():
        places[name] = slice(start, start + size(capacity))
        start += size(capacity)
    return places


def flat_length(layout: dict[str, slice]) -> int:
    """Elements of the flat array an int_layout tiles."""
    return max(place.stop for place in layout.values())


def varlen_span(layout: dict[str, slice]) -> slice:
    """The flat span of VARLEN_ARRAYS, first to last: a varlen step's one upload."""
    return slice(layout[VARLEN_ARRAYS[0]].start, layout[VARLEN_ARRAYS[-1]].stop)


class HostStaging:
    """One ring entry of host arrays, named as the device buffers: numpy views of one flat
    int64 array (`flat`; pinned on CUDA) laid out as the device's, and the block tables
    [rows, max pages] int32."""

    def __init__(self, capacity: Capacity, pin: bool) -> None:
        layout = int_layout(capacity)
        self.flat = torch.zeros(flat_length(layout), dtype=torch.int64, pin_memory=pin).numpy()
        for name, place in layout.items():
            setattr(self, name, self.flat[place])
        self.block_tables = torch.zeros(capacity.max_rows, capacity.max_pages,
                                        dtype=torch.int32, pin_memory=pin).numpy()


class StepBuffers:
    """Fixed-address device buffers a step reads (attribute `<name>_gpu` for each of the
    host arrays' names: views of one flat array, `flat_gpu`, laid out as each host entry's
    `flat`), the decode rows' constant index range, and the host ring."""

    def __init__(self, capacity: Capacity, device: torch.device):
        layout = int_layout(capacity)
        self.varlen_span = varlen_span(layout)
        self.flat_gpu = torch.zeros(flat_length(layout), dtype=torch.int64, device=device)
        for name, place in layout.items():
            setattr(self, f"{name}_gpu", self.flat_gpu[place])
        self.block_tables_gpu = torch.zeros(capacity.max_rows, capacity.max_pages,
                                            dtype=torch.int32, device=device)
        self.id_values_gpu = torch.zeros(capacity.max_rows, dtype=torch.int64, device=device)
        # a decode step's rows are 0..b-1, one token each: token rows, query starts and logits
        # rows are all this range, fixed for the step's bucket
        self.arange_gpu = torch.arange(capacity.max_rows + 1, device=device)
        pin = device.type == "cuda"
        self._ring = (HostStaging(capacity, pin), HostStaging(capacity, pin))
        self._turns = {"step": 0, "ids": 0}

    def next_host(self, use: str = "step") -> HostStaging:
        """The ring entry a step about to be staged writes, not the one the last step used.
        Two turns: `step` for a step's staged rows (decode or varlen), `ids` for a decode
        step's token ids (decode_ids, id_rows), written at launch."""
        self._turns[use] ^= 1
        return self._ring[self._turns[use]]


def sampled_sources(rows: list[Row], sampled: SampledTokens | None) -> list[int]:
    """Each row's place in `sampled` (-1: its last token is on the host)."""
    return [sampled.index_of.get(row.request.request_id, -1) if sampled else -1
            for row in rows]


def ids_from_sampled(ids_gpu: torch.Tensor, sources: list[int], sampled: SampledTokens | None,
                     rows_cpu: np.ndarray, rows_gpu: torch.Tensor,
                     values_gpu: torch.Tensor) -> None:
    """ids_gpu[r] = sampled.tokens_gpu[sources[r]] for each row r whose source is >= 0 (the
    others keep what the host uploaded): one copy when those rows lead in the sampled order,
    else a gather, its k destinations then k sources staged in rows_cpu (pinned) and copied to
    rows_gpu; values_gpu holds the gathered tokens. The host arrays are the step's ring entry."""
    moved = [(row, source) for row, source in enumerate(sources) if source >= 0]
    if not moved:
        return
    count = len(moved)
    if sources[:count] == list(range(count)):
        ids_gpu[:count].copy_(sampled.tokens_gpu[:count])
        return
    rows_cpu, rows_gpu = rows_cpu[:2 * count], rows_gpu[:2 * count]
    rows_cpu[:] = np.array(moved).T.reshape(-1)
    rows_gpu.copy_(torch.from_numpy(rows_cpu), non_blocking=True)
    values = values_gpu[:count]
    torch.index_select(sampled.tokens_gpu, 0, rows_gpu[count:], out=values)
    ids_gpu.index_copy_(0, rows_gpu[:count], values)


def copy_all(copies: list[tuple[torch.Tensor, np.ndarray]]) -> None:
    """Queues each (device view, host view) copy, host to device."""
    for device_view, host_view in copies:
        device_view.copy_(torch.from_numpy(host_view), non_blocking=True)
