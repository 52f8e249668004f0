"""The resident sampler state's two device ops, each one kernel (engine/sampling_state.py,
`SamplingSlots`; their torch references are there):

- `take_triton`: a resident decode step's sampling parameters gathered by slot and advanced
  (the reference's two index_selects and an index_add: three kernels in every drawing step's
  graph);
- `put_triton`: rows written whole into their slots from one staged block (the reference's
  two index_copies), on the steps after an admission.

Each program takes one row: it copies its slot's float and int columns into the step's columns,
then adds one to the slot's token index, which the draw no longer reads (it reads the step's
copy). Padding rows all sit on the sink slot: their index adds are atomic, so the sink advances
by their count as under index_add, and what they gather is never read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _take_kernel(table_floats, table_ints, slot_ids, out_floats, out_ints,
                 WIDTH: tl.constexpr, BLOCK: tl.constexpr, INDEX_COL: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slot_ids + row)
    columns = tl.arange(0, BLOCK)
    inside = columns < WIDTH
    tl.store(out_floats + row * WIDTH + columns,
             tl.load(table_floats + slot * WIDTH + columns, mask=inside), mask=inside)
    tl.store(out_ints + row * WIDTH + columns,
             tl.load(table_ints + slot * WIDTH + columns, mask=inside), mask=inside)
    tl.atomic_add(table_ints + slot * WIDTH + INDEX_COL, 1)


def take_triton(table_floats: torch.Tensor, table_ints: torch.Tensor, slot_ids: torch.Tensor,
                out_floats: torch.Tensor, out_ints: torch.Tensor, index_col: int) -> None:
    """table_*: [slots, width] (float32, int64), contiguous; slot_ids: [rows] int64; out_*:
    [>= rows, width], contiguous. out[r] = table[slot_ids[r]], then table_ints[slot_ids[r],
    index_col] += 1 for each row r."""
    rows, width = slot_ids.shape[0], table_floats.shape[1]
    if rows:
        _take_kernel[(rows,)](table_floats, table_ints, slot_ids, out_floats, out_ints,
                              WIDTH=width, BLOCK=triton.next_power_of_2(width),
                              INDEX_COL=index_col, num_warps=1)


@triton.jit
def _put_kernel(staged_ints, staged_floats, table_floats, table_ints, WIDTH: tl.constexpr,
                STAGED_WIDTH: tl.constexpr, FLOATS_AT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(staged_ints + row * STAGED_WIDTH)
    columns = tl.arange(0, BLOCK)
    inside = columns < WIDTH
    tl.store(table_ints + slot * WIDTH + columns,
             tl.load(staged_ints + row * STAGED_WIDTH + 1 + columns, mask=inside), mask=inside)
    # the float32 view has two columns to each int64 one
    tl.store(table_floats + slot * WIDTH + columns,
             tl.load(staged_floats + row * 2 * STAGED_WIDTH + FLOATS_AT + columns, mask=inside),
             mask=inside)


def put_triton(staged: torch.Tensor, table_floats: torch.Tensor, table_ints: torch.Tensor,
               floats_at: int) -> None:
    """staged: [rows, staged width] int64, contiguous: each row's slot, its `width` int
    columns, and its `width` float32 columns from column `floats_at` of the block's float32
    view (SamplingSlots' staged block); table_*: [slots, width] (float32, int64), contiguous.
    table_*[slot] = the row's columns, for each row (distinct slots)."""
    rows, staged_width = staged.shape
    width = table_ints.shape[1]
    if rows:
        _put_kernel[(rows,)](staged, staged.view(torch.float32), table_floats, table_ints,
                             WIDTH=width, STAGED_WIDTH=staged_width, FLOATS_AT=floats_at,
                             BLOCK=triton.next_power_of_2(width), num_warps=1)
