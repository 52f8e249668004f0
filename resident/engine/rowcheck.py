"""Row check (debug, `row_check: on`): after each resident step, sync and compare every row the
step read, the step's write locations and the sink row with the host streams."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np

from resident.engine.scheduler import StepPlan
from resident.model.step import StepMeta
from resident.planner import ResidentPlan, ResidentPlanner
from resident.resources.kv import KVPool

log = logging.getLogger("resident.rowcheck")


class RowCheck:
    def __init__(self, planner: ResidentPlanner, pools: dict[str, KVPool]) -> None:
        self.planner = planner
        self.pools = pools
        self.counts: Counter[str] = Counter()

    def check(self, step: StepPlan, plan: ResidentPlan, meta: StepMeta) -> int:
        """Runs after the step committed; returns this step's mismatches."""
        planner, layout = self.planner, self.planner.layout
        store = planner.store_gpu.cpu().numpy()  # the sync this debug mode may make
        write_loc = meta.kv_write_loc.cpu().numpy()
        position_pool = self.pools[layout.position_pool]
        mismatches = 0
        for index, (row, slot) in enumerate(zip(step.rows, plan.slot_ids, strict=False)):
            rid = row.request.request_id
            expected = planner.expected_row(rid)
            used = self._used_columns(rid)
            mismatches += self._compare(f"row {rid} (slot {slot})", store[slot], expected, used)
            stream = position_pool.streams[rid]
            wrote_at = position_pool.write_location(rid, stream.length - 1)
            if write_loc[index] != wrote_at:
                mismatches += 1
                log.error("row check: step wrote %s's token at %d, its stream says %d", rid,
                          write_loc[index], wrote_at)
        sink = planner.sink_row()
        mismatches += self._compare("sink row", store[0], sink, np.arange(layout.trash_col))
        self.counts.update(steps=1, rows=len(step.rows), mismatches=mismatches)
        return mismatches

    def _used_columns(self, rid: str) -> np.ndarray:
        layout = self.planner.layout
        columns = list(range(layout.num_narrow))
        for pool_layout in layout.pools:
            num_pages = len(self.pools[pool_layout.key].streams[rid].pages)
            columns += range(pool_layout.span_start, pool_layout.span_start + num_pages)
        return np.asarray(columns)

    @staticmethod
    def _compare(what: str, device_row: np.ndarray, expected: np.ndarray,
                 columns: np.ndarray) -> int:
        bad = columns[device_row[columns] != expected[columns]]
        for col in bad:
            log.error("row check: %s cell %d is %d on the device, %d in the host streams", what,
                      col, device_row[col], expected[col])
        return len(bad)
