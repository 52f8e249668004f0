"""Row check (debug, `row_check: on`): after each resident step, sync and compare what the step
read on the device with the host streams.

For every row the step read: the store row's cells the row uses (each KV pool's stored length and
its pages, the position offset, the GDN slot), and the position, KV write location and state slot
the step's graph gathered for it; then the sink row. The expected values come straight from the
pools (`KVPool.streams`, `Positions.position`, `StatePool.slots`), not from the planner's own row
builder, so a planner that builds a wrong row and a check that agrees with it cannot both pass.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np

from resident.model.step import StepMeta
from resident.planner import ResidentPlan, ResidentPlanner
from resident.resources.kv import SINK_PAGE, KVPool
from resident.resources.positions import Positions
from resident.resources.recurrent import SINK_SLOT, StatePool

log = logging.getLogger("resident.rowcheck")


class RowCheck:
    def __init__(self, planner: ResidentPlanner, pools: dict[str, KVPool],
                 positions: Positions, states: StatePool) -> None:
        self.planner = planner
        self.pools, self.positions, self.states = pools, positions, states
        self.counts: Counter[str] = Counter()

    def check(self, request_ids: list[str], plan: ResidentPlan, meta: StepMeta) -> int:
        """Runs after the step committed (each stream holds the step's token); `request_ids`:
        the step's rows, in order. Returns this step's mismatches."""
        store = self.planner.store_gpu.cpu().numpy()  # the sync this debug mode may make
        gathered = {"position": meta.positions.cpu().numpy(),
                    "write location": meta.kv_write_loc.cpu().numpy(),
                    "state slot": meta.state_slots.cpu().numpy()}
        mismatches = 0
        for index, (rid, slot) in enumerate(zip(request_ids, plan.slot_ids, strict=False)):
            mismatches += self._compare(f"row {rid} (slot {slot})", store[slot],
                                        self._expected_cells(rid))
            for what, want in self._expected_reads(rid).items():
                if gathered[what][index] != want:
                    mismatches += 1
                    log.error("row check: the step read %s's %s as %d, its streams say %d",
                              rid, what, gathered[what][index], want)
        mismatches += self._compare("sink row", store[0], self._sink_cells())
        self.counts.update(steps=1, rows=len(request_ids), mismatches=mismatches)
        return mismatches

    def _expected_cells(self, rid: str) -> dict[int, int]:
        """Column -> value of every cell of the row that a step reads."""
        layout = self.planner.layout
        cells = {layout.offset_col: self.positions.offsets[rid],
                 layout.state_col: self.states.slots[rid]}
        for pool_layout in layout.pools:
            stream = self.pools[pool_layout.key].streams[rid]
            cells[pool_layout.length_col] = stream.length
            for column, page in enumerate(stream.pages):
                cells[pool_layout.span_start + column] = page
        return cells

    def _expected_reads(self, rid: str) -> dict[str, int]:
        """What the step should have gathered for the row: its token was the stream's last."""
        pool = self.pools[self.planner.layout.position_pool]
        index = pool.streams[rid].length - 1
        return {"position": self.positions.position(rid, index),
                "write location": pool.write_location(rid, index),
                "state slot": self.states.slots[rid]}

    def _sink_cells(self) -> dict[int, int]:
        layout = self.planner.layout
        cells = {col: 0 for col in range(layout.trash_col)}
        cells[layout.state_col] = SINK_SLOT
        for pool_layout in layout.pools:
            cells[pool_layout.span_start] = SINK_PAGE
        return cells

    @staticmethod
    def _compare(what: str, device_row: np.ndarray, expected: dict[int, int]) -> int:
        bad = [col for col, value in expected.items() if device_row[col] != value]
        for col in bad:
            log.error("row check: %s cell %d is %d on the device, %d in the host streams", what,
                      col, device_row[col], expected[col])
        return len(bad)
