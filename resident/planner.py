"""ResidentPlanner: each decode request's planning state kept on the device.

A fixed-address int64 store holds one row per slot: the narrow cells (the stored length of every
KV pool, the position offset, the GDN slot), then one block-table span per KV pool, then a trash
cell. Row 0 is the sink (sink page, length 0, sink GDN slot) where padding rows point. A resident
decode step gathers its rows by slot into the buffers the model reads, runs, and advances the
appending pools' stored lengths itself; the host advances its mirror by the same rule and never
reads back.

Slots are a cache of 2 * B rows (B the widest decode bucket): a step's rows are at most B, and
besides them only the rows of the one earlier plan that may not have committed are out of reach,
so displacing the least recently run request always finds a victim. A displaced request takes a
fresh slot and a whole-row write when it next runs, as a new request does. A freed slot returns
only after the commit of the last step that read it.

Order of calls for a step: `plan` (slots; may run before the previous step commits, and may be
abandoned), `flush` (right before the step runs, after the previous step's commit: stages
whole rows and changed cells from the host streams, so an abandoned or refused plan never
touches the tables), the step's ops (scatter, gather, run, advance), then `commit`.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from resident.resources.kv import SINK_PAGE, KVPool
from resident.resources.positions import Positions
from resident.resources.recurrent import SINK_SLOT, StatePool

log = logging.getLogger("resident.planner")
SINK_ROW = 0
WALKS = ("decode",)


@dataclass(frozen=True)
class PoolLayout:
    """One KV pool's part of a row. A pool the walk only reads (appends False) keeps its pages
    and length on the table but gets no write addressing and no advance."""

    key: str
    length_col: int
    span_start: int
    span: int
    appends: bool


@dataclass(frozen=True)
class ResidentLayout:
    pools: tuple[PoolLayout, ...]
    offset_col: int  # position offset, against `position_pool`
    state_col: int  # GDN slot
    position_pool: str
    trash_col: int
    num_cols: int

    @property
    def num_narrow(self) -> int:
        return len(self.pools) + 2

    def pool(self, key: str) -> PoolLayout:
        return next(p for p in self.pools if p.key == key)


def build_layout(pools: list[tuple[str, int, bool]], position_pool: str) -> ResidentLayout:
    """pools: (key, span, appends) in order; narrow cells first, spans after, trash last."""
    num_narrow = len(pools) + 2
    layouts, start = [], num_narrow
    for index, (key, span, appends) in enumerate(pools):
        layouts.append(PoolLayout(key, index, start, span, appends))
        start += span
    return ResidentLayout(tuple(layouts), len(pools), len(pools) + 1, position_pool, start,
                          start + 1)


@dataclass
class ResidentPlan:
    """One resident step: its rows' slots (padded to the bucket with the sink) and what flush
    must write whole."""

    seq: int
    request_ids: list[str]
    slot_ids: list[int]  # [bucket]
    new_slots: list[str]  # requests that took a slot in this plan
    previous_reads: dict[int, int] = field(default_factory=dict)  # slot -> last_read before
    state: str = "planned"  # planned -> flushed -> committed, or abandoned


@dataclass
class StagedStep:
    """What flush leaves for the step's ops (device tensors at fixed addresses)."""

    slot_ids_gpu: torch.Tensor  # [bucket]
    cells_gpu: torch.Tensor  # [capacity, 3]
    width: int  # block-table columns the step's rows use (bounds a torch reference's reads)


@dataclass
class _Staging:
    """One ring entry: whole rows, and the slot ids + cells block (pinned on CUDA). Entries
    the last step staged are reset to the trash cell before the next; the rest stay trash."""

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


@dataclass
class _Slot:
    owner: str | None = None
    last_read: int = -1  # seq of the last plan that read this slot
    taken: int = -1  # order in which the owner took it (ties in displacement)


class ResidentPlanner:
    def __init__(self, max_bucket: int, pools: dict[str, tuple[KVPool, int, bool]],
                 states: StatePool, positions: Positions, position_pool: str,
                 device: torch.device) -> None:
        self.max_bucket = max_bucket
        self.pools = {key: pool for key, (pool, _, _) in pools.items()}
        self.states, self.positions = states, positions
        self.layout = build_layout([(k, span, appends) for k, (_, span, appends) in pools.items()],
                                   position_pool)
        self.num_rows = 2 * max_bucket + 1
        # the stored-length columns a resident step advances (the appending pools')
        self.append_cols = np.array([p.length_col for p in self.layout.pools if p.appends],
                                    dtype=np.int64)
        pin = device.type == "cuda"
        cols = self.layout.num_cols
        self.store_gpu = torch.zeros(self.num_rows, cols, dtype=torch.int64, device=device)
        self.mirror_cpu = np.zeros((self.num_rows, cols), dtype=np.int64)
        # block-table cells of each slot's row the device holds, per pool (layout order)
        self.pages_written_cpu = np.zeros((self.num_rows, len(pools)), dtype=np.int64)
        # the largest flush: B whole rows plus a cells row of every narrow cell and one
        # block-table column per pool for each of the B rows
        self.cell_capacity = max_bucket * (self.layout.num_narrow + len(pools))
        # a step's slot ids then its staged cells, one block so one H2D sends both
        staging = max_bucket + 3 * self.cell_capacity
        self._ring = [_Staging.allocate(max_bucket, cols, staging, pin, self.layout.trash_col)
                      for _ in range(2)]
        self._ring_index = 0
        self.staging_gpu = torch.zeros(staging, dtype=torch.int64, device=device)
        self.slot_ids_gpu = self.staging_gpu[:max_bucket]  # [max_bucket]
        self.cells_gpu = self.staging_gpu[max_bucket:].view(self.cell_capacity, 3)
        # [bucket] views of slot_ids_gpu, made once: a step's flush hands one out
        self._slot_views = [self.slot_ids_gpu[:bucket] for bucket in range(max_bucket + 1)]
        self._slots = [_Slot() for _ in range(self.num_rows)]
        self._slot_of: dict[str, int] = {}
        self._free: deque[int] = deque(range(1, self.num_rows))
        self._cooling: dict[int, int] = {}  # slot -> seq whose commit frees it
        self._stale: set[str] = set()
        self._outstanding: dict[int, ResidentPlan] = {}
        self._seqs = itertools.count(1)
        self._takes = itertools.count()
        self.committed_seq = 0
        # slot_releases: offloads that gave a slot up; slots_freed: finished or aborted requests
        self.counters = {"displaced": 0, "slot_releases": 0, "offloads_without_slot": 0,
                         "slots_freed": 0, "rows_written_whole": 0, "cells_staged": 0}

    @property
    def store_bytes(self) -> int:
        return self.store_gpu.numel() * self.store_gpu.element_size()

    def describe(self) -> str:
        return (f"{self.num_rows - 1} slots of {self.layout.num_cols} cells, "
                f"{self.store_bytes / 2**20:.1f} MiB, walks {list(WALKS)}")

    # -- plan -------------------------------------------------------------------------------

    def plan(self, request_ids: list[str], bucket: int) -> ResidentPlan:
        """Gives every row a slot, displacing least recently run requests outside the step and
        outside any uncommitted step. Changes nothing if it raises."""
        if not 0 < len(request_ids) <= bucket <= self.max_bucket:
            raise ValueError(f"a resident step of {len(request_ids)} rows in bucket {bucket} "
                             f"(widest {self.max_bucket})")
        seq = next(self._seqs)
        missing = [rid for rid in request_ids if rid not in self._slot_of]
        new_slots = self._take_slots(missing, set(request_ids)) if missing else []
        slot_ids = [self._slot_of[rid] for rid in request_ids]
        previous = {slot: self._slots[slot].last_read for slot in slot_ids}
        for slot in slot_ids:
            self._slots[slot].last_read = seq
        plan = ResidentPlan(seq, list(request_ids),
                            slot_ids + [SINK_ROW] * (bucket - len(slot_ids)), new_slots,
                            previous)
        self._outstanding[seq] = plan
        return plan

    def _take_slots(self, missing: list[str], in_step: set[str]) -> list[str]:
        """Free slots, then displaced ones, for the rows that hold none; checks that every row
        gets one before it changes anything."""
        free = list(self._free)
        displaced, taken = [], {}
        for rid in missing:
            slot = free.pop(0) if free else self._victim(in_step, displaced)
            if slot is None:
                raise RuntimeError("no slot to displace: more rows in flight than 2 * B")
            taken[rid] = slot
        for slot in displaced:
            self._drop_owner(slot)
            self.counters["displaced"] += 1
        for rid, slot in taken.items():
            if slot in self._free:
                self._free.remove(slot)
            self._slots[slot] = _Slot(owner=rid, taken=next(self._takes))
            self._slot_of[rid] = slot
        return missing

    def _victim(self, in_step: set[str], chosen: list[int]) -> int | None:
        reachable = [
            slot for slot, info in enumerate(self._slots)
            if info.owner is not None and info.owner not in in_step and slot not in chosen
            and not self._read_by_uncommitted(slot)
        ]
        if not reachable:
            return None
        victim = min(reachable, key=lambda s: (self._slots[s].last_read, self._slots[s].taken))
        chosen.append(victim)
        return victim

    def _read_by_uncommitted(self, slot: int) -> bool:
        last = self._slots[slot].last_read
        plan = self._outstanding.get(last)
        return last > self.committed_seq and plan is not None and plan.state != "abandoned"

    def _drop_owner(self, slot: int) -> None:
        owner = self._slots[slot].owner
        if owner is not None:
            del self._slot_of[owner]
            self._stale.discard(owner)
        self._slots[slot].owner = None

    # -- flush ------------------------------------------------------------------------------

    def flush(self, plan: ResidentPlan) -> StagedStep:
        """Stages the plan's whole rows (new, displaced, stale) and changed cells (page
        crossings, refreshed lengths) from the host streams, in one H2D for the cells and one
        per contiguous run of whole rows, and records them in the mirror."""
        if plan.state != "planned":
            raise RuntimeError(f"plan {plan.seq} is {plan.state}, not planned")
        ring = self._ring[self._ring_index]
        self._ring_index ^= 1
        num_rows = len(plan.request_ids)
        rows = list(zip(plan.request_ids, plan.slot_ids[:num_rows], strict=True))
        whole: list[tuple[int, str]] = []
        if plan.new_slots or self._stale:
            new, stale = set(plan.new_slots), self._stale
            whole = sorted((slot, rid) for rid, slot in rows if rid in new or rid in stale)
            rows = [(rid, slot) for rid, slot in rows if rid not in new and rid not in stale]
        cells: list[tuple[int, int, int]] = []
        width = self._stage_cells(rows, cells)
        for index, (slot, rid) in enumerate(whole):
            width = max(width, self._write_row(rid, slot, ring.rows[index]))
            self._stale.discard(rid)
        self._copy_runs(whole, ring.rows_cpu)
        if len(cells) > self.cell_capacity:
            raise RuntimeError(f"{len(cells)} staged cells exceed the ring's {self.cell_capacity}")
        ring.stage(plan.slot_ids, cells)
        self.staging_gpu.copy_(ring.staging_cpu, non_blocking=True)
        self.counters["rows_written_whole"] += len(whole)
        self.counters["cells_staged"] += len(cells)
        plan.state = "flushed"
        return StagedStep(self._slot_views[len(plan.slot_ids)], self.cells_gpu, width)

    def stage_idle(self, bucket: int) -> None:
        """An all-padding step of the bucket for a graph's capture: every row the sink, every
        staged cell the trash cell (not the step path: it writes the device buffers directly)."""
        self.slot_ids_gpu[:bucket].fill_(SINK_ROW)
        self.cells_gpu.copy_(torch.tensor([SINK_ROW, self.layout.trash_col, 0]))

    def _host_row(self, rid: str) -> tuple[np.ndarray, dict[str, int]]:
        """The row as the host streams say it should be, and each pool's page count."""
        layout = self.layout
        row = np.zeros(layout.num_cols, dtype=np.int64)
        num_pages = {}
        for pool_layout in layout.pools:
            stream = self.pools[pool_layout.key].streams[rid]
            pages = stream.pages[:pool_layout.span]
            if len(stream.pages) > pool_layout.span:
                raise RuntimeError(f"request {rid} holds {len(stream.pages)} pages of pool "
                                   f"{pool_layout.key}, more than a row's {pool_layout.span}")
            row[pool_layout.length_col] = stream.length
            row[pool_layout.span_start:pool_layout.span_start + len(pages)] = pages
            num_pages[pool_layout.key] = len(pages)
        row[layout.offset_col] = self.positions.offsets[rid]
        row[layout.state_col] = self.states.slots[rid]
        return row, num_pages

    def _write_row(self, rid: str, slot: int, out: np.ndarray) -> int:
        row, num_pages = self._host_row(rid)
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

    # -- after the step ---------------------------------------------------------------------

    def commit(self, plan: ResidentPlan) -> None:
        """The step ran: advance the mirror's stored lengths as the step's last op did on the
        device, and return slots whose last reader this was."""
        if plan.state != "flushed":
            raise RuntimeError(f"plan {plan.seq} is {plan.state}, not flushed")
        # the rows' slots (distinct), then the bucket's padding on the sink
        slots = np.array(plan.slot_ids[:len(plan.request_ids)])
        self.mirror_cpu[slots[:, None], self.append_cols] += 1
        plan.state = "committed"
        self.committed_seq = max(self.committed_seq, plan.seq)
        del self._outstanding[plan.seq]
        if self._cooling:
            self._return_cooled()

    def abandon(self, plan: ResidentPlan) -> None:
        """A plan that will not run (never flushed): its new slots go back unread."""
        if plan.state != "planned":
            raise RuntimeError(f"plan {plan.seq} is {plan.state}; only a planned step abandons")
        plan.state = "abandoned"
        del self._outstanding[plan.seq]
        for slot, last_read in plan.previous_reads.items():  # an earlier reader may be in flight
            if self._slots[slot].last_read == plan.seq:
                self._slots[slot].last_read = last_read
            if self._cooling.get(slot) == plan.seq:
                self._cooling[slot] = last_read
        for rid in plan.new_slots:
            slot = self._slot_of.get(rid)
            if slot is not None:
                self._drop_owner(slot)
                self._free.append(slot)
        self._return_cooled()

    def release(self, request_id: str, offload: bool = False) -> None:
        """A request finished, was aborted or offloaded: its slot cools until the last step
        that read it commits."""
        slot = self._slot_of.get(request_id)
        if slot is None:
            if offload:
                self.counters["offloads_without_slot"] += 1
            return
        self._drop_owner(slot)
        self.counters["slot_releases" if offload else "slots_freed"] += 1
        if self._read_by_uncommitted(slot):
            self._cooling[slot] = self._slots[slot].last_read
        else:
            self._free.append(slot)

    def mark_stale(self, request_ids) -> None:
        """A host-planned step moved these streams: their rows are written whole next time."""
        self._stale.update(rid for rid in request_ids if rid in self._slot_of)

    def _return_cooled(self) -> None:
        for slot, seq in list(self._cooling.items()):
            plan = self._outstanding.get(seq)
            if seq <= self.committed_seq or plan is None:
                del self._cooling[slot]
                self._free.append(slot)

    # -- inspection (tests, row check) ------------------------------------------------------

    def slot_of(self, request_id: str) -> int | None:
        return self._slot_of.get(request_id)

    def ledger(self) -> dict[str, set[int]]:
        held = {slot for slot in self._slot_of.values()}
        return {"free": set(self._free), "cooling": set(self._cooling), "held": held}

    def expected_row(self, request_id: str) -> np.ndarray:
        return self._host_row(request_id)[0]

    def sink_row(self) -> np.ndarray:
        row = np.zeros(self.layout.num_cols, dtype=np.int64)
        row[self.layout.state_col] = SINK_SLOT
        for pool_layout in self.layout.pools:
            row[pool_layout.span_start] = SINK_PAGE
        return row
