"""The resident ops as Triton kernels: the same contracts as the torch references in
resident/kernels/resident.py, with static grids (one program a staged cell, a row, or a block of
a row's table) and no host reads, so a decode bucket's capture can record them.

store: [R, C] int64 contiguous, one row per slot (row 0 the sink).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _scatter_cells_kernel(store, cells, num_cols):
    i = tl.program_id(0)
    slot = tl.load(cells + i * 3)
    col = tl.load(cells + i * 3 + 1)
    value = tl.load(cells + i * 3 + 2)
    tl.store(store + slot * num_cols + col, value)


def scatter_cells_triton(store: torch.Tensor, cells: torch.Tensor) -> None:
    """store[slot, col] = value for every (slot, col, value) row of cells [K, 3]; unused entries
    point at a trash cell. Distinct entries must name distinct cells (the planner stages each
    cell once)."""
    _scatter_cells_kernel[(cells.shape[0],)](store, cells.contiguous(), store.shape[1])


# a gather program's block-table columns: a row's table is copied by width / BLOCK programs at
# once (a decode graph's width is the whole span). One program a row, walking the span block
# after block, took 7.8 µs of a 0.99 ms c=1 step on an H100, these 1.8
# (results/2026-12-06-h100-exposed)
GATHER_BLOCK = 128


@triton.jit
def _gather_rows_kernel(store, slot_ids, block_tables, bt_stride, positions, kv_write_loc,
                        state_slots, num_cols, length_col, offset_col, state_col, span_start,
                        page_size, width, BLOCK: tl.constexpr):
    """Program (row, block): the row's block-table columns [block * BLOCK, +BLOCK) below
    width; block 0 also its position, KV write location and state slot."""
    row, block = tl.program_id(0), tl.program_id(1)
    base = store + tl.load(slot_ids + row) * num_cols
    j = block * BLOCK + tl.arange(0, BLOCK)
    mask = j < width
    pages = tl.load(base + span_start + j, mask=mask)
    tl.store(block_tables + row * bt_stride + j, pages.to(block_tables.dtype.element_ty),
             mask=mask)
    if block == 0:
        length = tl.load(base + length_col)
        tl.store(positions + row, tl.load(base + offset_col) + length)
        tl.store(state_slots + row, tl.load(base + state_col))
        column = tl.minimum(length // page_size, width - 1)
        page = tl.load(base + span_start + column)
        tl.store(kv_write_loc + row, page * page_size + length % page_size)


def gather_rows_triton(store, slot_ids, length_col, offset_col, state_col, span_start, width,
                       page_size, block_tables, positions, kv_write_loc, state_slots,
                       block: int = GATHER_BLOCK) -> None:
    """Fills a decode step's buffers from its rows, as gather_rows_ref does. block_tables may be
    a column slice of a wider buffer (rows keep their stride). block: a program's columns (a
    power of two)."""
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables must be contiguous along its columns")
    _gather_rows_kernel[(slot_ids.shape[0], max(1, triton.cdiv(width, block)))](
        store, slot_ids, block_tables, block_tables.stride(0), positions, kv_write_loc,
        state_slots, store.shape[1], length_col, offset_col, state_col, span_start, page_size,
        width, BLOCK=block)


@triton.jit
def _advance_kernel(store, slot_ids, length_cols, num_cols, NUM_LENGTH_COLS: tl.constexpr):
    row = tl.program_id(0)
    slot = tl.load(slot_ids + row)
    step = (slot != 0).to(tl.int64)  # padding rows sit on the sink, which stays zero
    for i in tl.static_range(NUM_LENGTH_COLS):
        cell = store + slot * num_cols + tl.load(length_cols + i)
        tl.store(cell, tl.load(cell) + step)


def advance_lengths_triton(store: torch.Tensor, slot_ids: torch.Tensor,
                           length_cols: torch.Tensor) -> None:
    """One token a row on every appending pool's stored length; length_cols [k] int64 lives on
    the device (fixed at build, so the capture reads no host list)."""
    _advance_kernel[(slot_ids.shape[0],)](store, slot_ids, length_cols, store.shape[1],
                                          NUM_LENGTH_COLS=length_cols.shape[0])
