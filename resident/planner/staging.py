"""RowStager: the planner's device store, its host mirror, and what each flush sends.

The store is a fixed-address int64 tensor of one row per slot (layout.py). The host keeps a mirror
of every cell the device holds and, per slot and pool, how many block-table cells it has written.
A flush compares a step's rows with the host streams and sends only what changed:

- whole rows (new, displaced or stale requests): written into a pinned ring entry and copied
  with one H2D per run of consecutive slots;
- changed cells (refreshed narrow cells, block-table columns past those written: page
  crossings): (slot, column, value) triples in the same pinned block as the step's slot ids, so
  one H2D sends both; the graph's first kernel scatters them.

Staging entries the last step used are reset to the trash cell before the next (the rest stay
trash), so the scatter always writes the whole cells block. The ring has two entries, since a
step may be staged while the one before it runs, and is sized at build for the largest flush (B
whole rows plus a cells row per row and pool), so nothing grows in the step path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resident.planner.layout import SINK_ROW, PoolLayout, ResidentLayout
from resident.planner.slots import ResidentPlan
from resident.resources.kv import SINK_PAGE, KVPool
from resident.resources.positions import Positions
from resident.resources.recurrent import SINK_SLOT, StatePool


@dataclass
class StagedStep:
    """What a flush leaves for the step's ops (device tensors at fixed addresses)."""

    slot_ids_gpu: torch.Tensor  # [bucket]
    cells_gpu: torch.Tensor  # [capacity, 3]
    width: int  # block-table columns the step's rows use (bounds a torch reference's reads)
    whole_rows: tuple[tuple[int, str], ...] = ()  # (slot, request id) of the rows written whole

    @property
    def bucket(self) -> int:
        return self.slot_ids_gpu.shape[0]


@dataclass
class _Staging:
    """One ring entry: whole rows, and the slot ids + cells block (pinned on CUDA)."""

    rows_cpu: torch.Tensor  # [B, C]
    staging_cpu: torch.Tensor  # [B + 3 * capacity]
    rows: np.ndarray
    slot_ids: np.ndarray  # [B]
    cells: np.ndarray  # [capacity, 3]
    trash: tuple[int, int, int]
    num_dirty: int = 0

    @classmethod
    def allocate(cls, max_bucket: int, cols: int, size: int, pin: bool,
                 trash_col: int) -> _Staging:
        rows_cpu = torch.zeros(max_bucket, cols, dtype=torch.int64, pin_memory=pin)
        staging_cpu = torch.zeros(size, dtype=torch.int64, pin_memory=pin)
        block = staging_cpu.numpy()
        cells = block[max_bucket:].reshape(-1, 3)
        trash = (SINK_ROW, trash_col, 0)
        cells[:] = trash
        return cls(rows_cpu, staging_cpu, rows_cpu.numpy(), block[:max_bucket], cells, trash)

    def stage(self, slot_ids: list[int], cells: list[tuple[int, int, int]]) -> None:
        self.slot_ids[:len(slot_ids)] = slot_ids
        self.cells[:self.num_dirty] = self.trash
        if cells:
            self.cells[:len(cells)] = cells
        self.num_dirty = len(cells)


class RowStager:
    def __init__(self, layout: ResidentLayout, num_rows: int, max_bucket: int,
                 pools: dict[str, KVPool], states: StatePool, positions: Positions,
                 device: torch.device) -> None:
        self.layout = layout
        self.pools, self.states, self.positions = pools, states, positions
        self.append_cols = np.array(layout.append_cols, dtype=np.int64)
        cols = layout.num_cols
        self.store_gpu = torch.zeros(num_rows, cols, dtype=torch.int64, device=device)
        self.mirror_cpu = np.zeros((num_rows, cols), dtype=np.int64)
        # block-table cells of each slot's row the device holds, per pool (layout order)
        self.pages_written_cpu = np.zeros((num_rows, len(layout.pools)), dtype=np.int64)
        # the largest flush: B whole rows plus a cells row of every narrow cell and one
        # block-table column per pool for each of the B rows
        self.cell_capacity = max_bucket * (layout.num_narrow + len(layout.pools))
        # a step's slot ids then its staged cells, one block so one H2D sends both
        size = max_bucket + 3 * self.cell_capacity
        pin = device.type == "cuda"
        self._ring = [_Staging.allocate(max_bucket, cols, size, pin, layout.trash_col)
                      for _ in range(2)]
        self._ring_index = 0
        self.staging_gpu = torch.zeros(size, dtype=torch.int64, device=device)
        self.slot_ids_gpu = self.staging_gpu[:max_bucket]  # [max_bucket]
        self.cells_gpu = self.staging_gpu[max_bucket:].view(self.cell_capacity, 3)
        # [bucket] views of slot_ids_gpu, made once: a step's flush hands one out
        self._slot_views = [self.slot_ids_gpu[:bucket] for bucket in range(max_bucket + 1)]
        self.counters = {"rows_written_whole": 0, "cells_staged": 0}

    def buffers(self) -> list[torch.Tensor]:
        """Every buffer a flush writes: allocated at build, never in the step path."""
        return [*(t for entry in self._ring for t in (entry.rows_cpu, entry.staging_cpu)),
                self.staging_gpu, self.store_gpu]

    def flush(self, plan: ResidentPlan, whole_rows: set[str]) -> StagedStep:
        """Stages the plan's whole rows and its other rows' changed cells from the host streams,
        in one H2D for the cells and one per contiguous run of whole rows, and records them in
        the mirror."""
        ring = self._ring[self._ring_index]
        self._ring_index ^= 1
        rows = list(zip(plan.request_ids, plan.row_slots, strict=True))
        whole = sorted((slot, rid) for rid, slot in rows if rid in whole_rows)
        if whole:
            rows = [(rid, slot) for rid, slot in rows if rid not in whole_rows]
        cells: list[tuple[int, int, int]] = []
        width = self._stage_cells(rows, cells)
        for index, (slot, rid) in enumerate(whole):
            width = max(width, self._write_row(rid, slot, ring.rows[index]))
        self._copy_runs(whole, ring.rows_cpu)
        if len(cells) > self.cell_capacity:
            raise RuntimeError(f"{len(cells)} staged cells exceed the ring's {self.cell_capacity}")
        ring.stage(plan.slot_ids, cells)
        self.staging_gpu.copy_(ring.staging_cpu, non_blocking=True)
        self.counters["rows_written_whole"] += len(whole)
        self.counters["cells_staged"] += len(cells)
        return StagedStep(self._slot_views[len(plan.slot_ids)], self.cells_gpu, width,
                          tuple(whole))

    def advance(self, plan: ResidentPlan) -> None:
        """The step ran: the mirror's stored lengths advance as the step's last op did on the
        device (the rows' slots are distinct; the padding's sink row is left alone)."""
        slots = np.array(plan.row_slots)
        self.mirror_cpu[slots[:, None], self.append_cols] += 1

    def stage_idle(self, bucket: int) -> None:
        """An all-padding step of the bucket for a graph's capture: every row the sink, every
        staged cell the trash cell (not the step path: it writes the device buffers directly)."""
        self.slot_ids_gpu[:bucket].fill_(SINK_ROW)
        self.cells_gpu.copy_(torch.tensor([SINK_ROW, self.layout.trash_col, 0]))

    def host_row(self, rid: str) -> tuple[np.ndarray, dict[str, int]]:
        """The row as the host streams say it should be, and each pool's page count."""
        layout = self.layout
        row = np.zeros(layout.num_cols, dtype=np.int64)
        num_pages = {}
        for pool_layout in layout.pools:
            stream = self.pools[pool_layout.key].streams[rid]
            if len(stream.pages) > pool_layout.span:
                raise RuntimeError(f"request {rid} holds {len(stream.pages)} pages of pool "
                                   f"{pool_layout.key}, more than a row's {pool_layout.span}")
            row[pool_layout.length_col] = stream.length
            row[pool_layout.span_start:pool_layout.span_start + len(stream.pages)] = stream.pages
            num_pages[pool_layout.key] = len(stream.pages)
        row[layout.offset_col] = self.positions.offsets[rid]
        row[layout.state_col] = self.states.slots[rid]
        return row, num_pages

    def sink_row(self) -> np.ndarray:
        row = np.zeros(self.layout.num_cols, dtype=np.int64)
        row[self.layout.state_col] = SINK_SLOT
        for pool_layout in self.layout.pools:
            row[pool_layout.span_start] = SINK_PAGE
        return row

    def _write_row(self, rid: str, slot: int, out: np.ndarray) -> int:
        row, num_pages = self.host_row(rid)
        out[:] = row
        self.mirror_cpu[slot] = row
        self.pages_written_cpu[slot] = [num_pages[p.key] for p in self.layout.pools]
        return max(num_pages.values(), default=1)

    def _stage_cells(self, rows: list[tuple[str, int]],
                     cells: list[tuple[int, int, int]]) -> int:
        """Cells of valid rows that differ from the mirror: narrow cells, and block-table
        columns past those already written (page crossings, a few rows a step), each compared
        for all rows at once. Returns the widest row's pages. This runs for every row of every
        resident step, so it reads each stream's length and page count and nothing more."""
        if not rows:
            return 1
        layout = self.layout
        rids = [rid for rid, _ in rows]
        slots = np.array([slot for _, slot in rows])
        pool_streams = [[self.pools[p.key].streams[rid] for rid in rids] for p in layout.pools]
        offsets, state_slots = self.positions.offsets, self.states.slots
        # [num_narrow + num_pools, rows]: each pool's length, the offset, the GDN slot (the
        # narrow cells in layout order), then each pool's page count
        host = np.array([*([stream.length for stream in streams] for streams in pool_streams),
                         [offsets[rid] for rid in rids], [state_slots[rid] for rid in rids],
                         *([len(stream.pages) for stream in streams]
                           for streams in pool_streams)])
        narrow, counts = host[:layout.num_narrow].T, host[layout.num_narrow:]
        changed = narrow != self.mirror_cpu[slots, :layout.num_narrow]
        if changed.any():
            changed_rows, changed_cols = np.nonzero(changed)
            cells.extend(zip(slots[changed_rows].tolist(), changed_cols.tolist(),
                             narrow[changed_rows, changed_cols].tolist(), strict=True))
            self.mirror_cpu[slots, :layout.num_narrow] = narrow
        widest = counts.max(axis=1).tolist()
        for index, pool_layout in enumerate(layout.pools):
            if widest[index] > pool_layout.span:
                rid = rids[int(counts[index].argmax())]
                raise RuntimeError(f"request {rid} holds {widest[index]} pages of pool "
                                   f"{pool_layout.key}, more than a row's {pool_layout.span}")
        written = self.pages_written_cpu[slots].T  # [num_pools, rows]
        if (counts != written).any():  # crossings (or a stream that shrank)
            for index, pool_layout in enumerate(layout.pools):
                self._stage_crossings(pool_layout, pool_streams[index], slots, counts[index],
                                      written[index], cells)
            self.pages_written_cpu[slots] = counts.T
        return max(widest)

    def _stage_crossings(self, pool_layout: PoolLayout, streams: list, slots: np.ndarray,
                         counts: np.ndarray, written: np.ndarray,
                         cells: list[tuple[int, int, int]]) -> None:
        """The block-table columns a pool's rows gained since their last write."""
        for row in np.nonzero(counts > written)[0].tolist():
            slot, pages = int(slots[row]), streams[row].pages
            for column in range(int(written[row]), int(counts[row])):
                cells.append((slot, pool_layout.span_start + column, pages[column]))
                self.mirror_cpu[slot, pool_layout.span_start + column] = pages[column]

    def _copy_runs(self, whole: list[tuple[int, str]], rows_cpu: torch.Tensor) -> None:
        """One H2D per run of consecutive slots (whole rows sit in slot order in the ring)."""
        start = 0
        for index in range(1, len(whole) + 1):
            if index == len(whole) or whole[index][0] != whole[index - 1][0] + 1:
                first = whole[start][0]
                self.store_gpu[first:first + index - start].copy_(rows_cpu[start:index],
                                                                  non_blocking=True)
                start = index
