"""The resident ops a captured decode step records: the torch references.

store: [R, C] int64, one row per slot (row 0 the sink). A row's layout is the planner's
ResidentLayout: narrow cells (stored length per KV pool, position offset, GDN slot), one
block-table span per KV pool, and a trash cell that unused staging entries write to.
"""

from __future__ import annotations

import torch


def scatter_cells_ref(
    store: torch.Tensor,  # [R, C]
    cells: torch.Tensor,  # [K, 3]: (slot, column, value); unused entries hit a trash cell
) -> None:
    store[cells[:, 0], cells[:, 1]] = cells[:, 2]


def gather_rows_ref(
    store: torch.Tensor,  # [R, C]
    slot_ids: torch.Tensor,  # [b]
    length_col: int,
    offset_col: int,
    state_col: int,
    span_start: int,
    width: int,  # block-table columns the step reads
    page_size: int,
    block_tables: torch.Tensor,  # out [b, width] int32
    positions: torch.Tensor,  # out [b]
    kv_write_loc: torch.Tensor,  # out [b]
    state_slots: torch.Tensor,  # out [b]
) -> None:
    """Fills a decode step's buffers from its rows: the new token sits at the stored length."""
    rows = store[slot_ids]  # [b, C]
    lengths = rows[:, length_col]
    tables = rows[:, span_start:span_start + width]
    block_tables.copy_(tables)
    positions.copy_(rows[:, offset_col] + lengths)
    page = tables.gather(1, (lengths // page_size)[:, None].clamp(max=width - 1))[:, 0]
    kv_write_loc.copy_(page * page_size + lengths % page_size)
    state_slots.copy_(rows[:, state_col])


def advance_lengths_ref(
    store: torch.Tensor,  # [R, C]
    slot_ids: torch.Tensor,  # [b]
    length_cols: list[int],  # the appending pools' stored-length columns
) -> None:
    """One token a row, on every row but the sink (padding rows stay on row 0, which stays 0)."""
    step = (slot_ids != 0).to(store.dtype)
    for col in length_cols:
        store[slot_ids, col] += step
