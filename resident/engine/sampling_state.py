"""Where the draw's per-row parameters live on the device (draw.py: RowParams).

- `ParamColumns`: a step's rows' parameters at fixed addresses, [max_rows, 3] float32
  (temperature, top_p, min_p) and [max_rows, 3] int64 (top_k, seed, index): what a draw, and a
  captured draw graph, read.
- `HostColumns`: their pinned host staging; the host-planned arm, and every varlen step, stage
  each step's rows there and upload them (two H2D copies a step).
- `SamplingSlots` (resident planning): the same columns for every slot of the resident planner's
  store. A request's row is written only when the planner writes its row whole (new, displaced,
  or stale after a host-planned step): one staged block (each row's slot, ints and floats)
  copied and scattered into the slots (`write`: one H2D and one kernel on CUDA); a decode step
  gathers its rows by slot into the step's columns and advances their token index on the
  device (`take`: one kernel on CUDA), inside the decode step's graph, so a captured resident
  step uploads no sampling parameters.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from resident.engine.draw import RowParams

INDEX_COL = 2  # the token index's column among the int64 ones
WIDTH = 3  # columns of each dtype
# a whole-row write's staged row, int64: its slot, its WIDTH ints, then its WIDTH float32s
# packed two to a column (the last float32 is padding)
STAGED_WIDTH = 1 + WIDTH + (WIDTH + 1) // 2
FLOATS_AT = 2 * (1 + WIDTH)  # the floats' first column in the staged block's float32 view


class RowColumns(NamedTuple):
    """A step's rows in ParamColumns' layout, as the host knows them: each row's float column
    (temperature, top_p, min_p) and int column (top_k, seed as int64 bits, token index)."""

    floats: list[tuple[float, float, float]]
    ints: list[tuple[int, int, int]]


def seed_bits(seed: int) -> int:
    """A seed in [-2**63, 2**64) as the int64 with its low 64 bits."""
    seed %= 2**64
    return seed - 2**64 if seed >= 2**63 else seed


class ParamColumns:
    def __init__(self, num_rows: int, device: torch.device) -> None:
        self.floats_gpu = torch.zeros(num_rows, WIDTH, dtype=torch.float32, device=device)
        self.ints_gpu = torch.zeros(num_rows, WIDTH, dtype=torch.int64, device=device)

    def params(self, num_rows: int) -> RowParams:
        """The first num_rows rows' parameters, as views."""
        floats, ints = self.floats_gpu[:num_rows], self.ints_gpu[:num_rows]
        return RowParams(temperature=floats[:, 0], top_k=ints[:, 0], top_p=floats[:, 1],
                         min_p=floats[:, 2], seed=ints[:, 1], index=ints[:, INDEX_COL])


class HostColumns:
    """Pinned (on CUDA) host rows of ParamColumns' layout, a step's rows written as one block a
    dtype."""

    def __init__(self, num_rows: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.floats_cpu = torch.zeros(num_rows, WIDTH, dtype=torch.float32, pin_memory=pin)
        self.ints_cpu = torch.zeros(num_rows, WIDTH, dtype=torch.int64, pin_memory=pin)

    def put(self, rows: RowColumns) -> None:
        count = len(rows.floats)
        if count > self.floats_cpu.shape[0]:
            raise ValueError(f"{count} sampling rows exceed the staging's "
                             f"{self.floats_cpu.shape[0]}")
        if not count:
            return
        # one block assignment a dtype: numpy converts the list at C speed (a row at a time
        # cost ~2 us a row, 0.25 ms a 64-row step)
        self.floats_cpu.numpy()[:count] = rows.floats
        self.ints_cpu.numpy()[:count] = rows.ints

    def upload(self, columns: ParamColumns, num_rows: int) -> None:
        columns.floats_gpu[:num_rows].copy_(self.floats_cpu[:num_rows], non_blocking=True)
        columns.ints_gpu[:num_rows].copy_(self.ints_cpu[:num_rows], non_blocking=True)


class SamplingSlots:
    def __init__(self, num_slots: int, max_rows: int, slot_ids_gpu: torch.Tensor,
                 device: torch.device) -> None:
        """slot_ids_gpu: the resident planner's [>= bucket] slot ids of a step's rows, at a
        fixed address (its flush writes them)."""
        self.table = ParamColumns(num_slots, device)  # [num_slots, WIDTH] each
        self.slot_ids_gpu = slot_ids_gpu
        # whole-row writes, staged and sent in stream order before the draw: [max_rows,
        # STAGED_WIDTH], one block so that one H2D sends a write's slots and both dtypes
        pin = device.type == "cuda"
        self._staged_cpu = torch.zeros(max_rows, STAGED_WIDTH, dtype=torch.int64, pin_memory=pin)
        block = self._staged_cpu.numpy()
        self._staged_slots, self._staged_ints = block[:, 0], block[:, 1:1 + WIDTH]
        self._staged_floats = block.view(np.float32)[:, FLOATS_AT:FLOATS_AT + WIDTH]
        self._staged_gpu = torch.zeros(max_rows, STAGED_WIDTH, dtype=torch.int64, device=device)
        self._take = self._put = self._ones_gpu = None
        if device.type == "cuda":  # imported here: triton must not load before TRITON_INTERPRET
            from resident.kernels.slot_params import put_triton, take_triton

            self._take, self._put = take_triton, put_triton
        else:  # the reference's index counts (take)
            self._ones_gpu = torch.ones(max_rows, dtype=torch.int64, device=device)
        self.rows_written = 0

    def write(self, slots: list[int], rows: RowColumns) -> None:
        """Writes rows whole into their (distinct) slots: one H2D of the staged block, then
        its scatter (on CUDA one kernel, kernels/slot_params.py; else this reference's two
        index_copies). The staging is reused by the next step's write only after this step's
        tokens are read back."""
        count = len(slots)
        if count > self._staged_slots.shape[0]:
            raise ValueError(f"{count} whole rows exceed the staging's "
                             f"{self._staged_slots.shape[0]}")
        self._staged_slots[:count] = slots
        self._staged_ints[:count] = rows.ints
        self._staged_floats[:count] = rows.floats
        staged = self._staged_gpu[:count]
        staged.copy_(self._staged_cpu[:count], non_blocking=True)
        self.rows_written += count
        if self._put is not None:
            self._put(staged, self.table.floats_gpu, self.table.ints_gpu, FLOATS_AT)
            return
        slot_ids = staged[:, 0]
        self.table.ints_gpu.index_copy_(0, slot_ids, staged[:, 1:1 + WIDTH])
        self.table.floats_gpu.index_copy_(
            0, slot_ids, staged.view(torch.float32)[:, FLOATS_AT:FLOATS_AT + WIDTH])

    def take(self, columns: ParamColumns, bucket: int) -> None:
        """The bucket's rows' parameters, by slot, into the step's columns, then one token more
        on each row's index in the table (the draw reads the step's copy; the sink's padding
        rows advance too, and nothing reads the sink's). Device only: on CUDA one kernel
        (kernels/slot_params.py), else this reference's three ops."""
        if self._take is not None:
            self._take(self.table.floats_gpu, self.table.ints_gpu, self.slot_ids_gpu[:bucket],
                       columns.floats_gpu, columns.ints_gpu, INDEX_COL)
            return
        slot_ids = self.slot_ids_gpu[:bucket]
        torch.index_select(self.table.floats_gpu, 0, slot_ids, out=columns.floats_gpu[:bucket])
        torch.index_select(self.table.ints_gpu, 0, slot_ids, out=columns.ints_gpu[:bucket])
        self.table.ints_gpu[:, INDEX_COL].index_add_(0, slot_ids, self._ones_gpu[:bucket])
