"""ResidentOps: the resident planner's ops around a decode bucket's forward.

Before the forward: scatter the staged cells into the store, then gather the step's rows by slot
into the buffers the model reads (positions, KV write locations, state slots, block tables).
After it: advance the appending pools' stored lengths. All three read only device buffers at
fixed addresses (the planner's store, staged cells and slot ids), so under `cuda_graphs` they
are recorded in the bucket's graph and a resident step is the staging H2D (planner.flush), the
token ids' H2D and one replay. On CUDA they are the Triton kernels (kernels/resident_triton.py);
on CPU the torch references, or the Triton kernels in the interpreter under the `triton`
backend (the tests' way to run them through the engine).
"""

from __future__ import annotations

import torch

from resident.kernels.resident import advance_lengths_ref, gather_rows_ref, scatter_cells_ref
from resident.planner import ResidentPlanner


class ResidentOps:
    def __init__(self, planner: ResidentPlanner, page_size: int, use_triton: bool) -> None:
        self.planner, self.page_size, self.use_triton = planner, page_size, use_triton
        layout = planner.layout
        self._position_pool = layout.pool(layout.position_pool)
        self._scatter, self._gather = scatter_cells_ref, gather_rows_ref
        self._advance = advance_lengths_ref
        self._length_cols = planner.layout.append_cols
        if use_triton:  # imported here: triton must not load before TRITON_INTERPRET is set
            from resident.kernels.resident_triton import (
                advance_lengths_triton,
                gather_rows_triton,
                scatter_cells_triton,
            )
            self._scatter, self._gather = scatter_cells_triton, gather_rows_triton
            self._advance = advance_lengths_triton
            self._length_cols = torch.tensor(planner.layout.append_cols,
                                             device=planner.store_gpu.device)

    def before(self, bucket: int, width: int, block_tables: torch.Tensor,
               positions: torch.Tensor, kv_write_loc: torch.Tensor,
               state_slots: torch.Tensor) -> None:
        """Scatter, then gather the bucket's rows into the given [bucket] (and [bucket, width])
        device views."""
        planner, layout, pool = self.planner, self.planner.layout, self._position_pool
        self._scatter(planner.store_gpu, planner.cells_gpu)
        self._gather(planner.store_gpu, planner.slot_ids_gpu[:bucket], pool.length_col,
                     layout.offset_col, layout.state_col, pool.span_start, width,
                     self.page_size, block_tables, positions, kv_write_loc, state_slots)

    def after(self, bucket: int) -> None:
        """One token more on every row's appending pools (not on the sink's padding rows)."""
        self._advance(self.planner.store_gpu, self.planner.slot_ids_gpu[:bucket],
                      self._length_cols)
