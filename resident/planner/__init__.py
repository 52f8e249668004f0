"""ResidentPlanner: each decode request's planning state kept on the device.

A fixed-address int64 store holds one row per slot (layout.py: the narrow cells, then a
block-table span per KV pool). A resident decode step gathers its rows by slot into the buffers
the model reads, runs, and advances the appending pools' stored lengths itself; the host advances
its mirror by the same rule and never reads back. Which request holds which slot is the
SlotCache's (slots.py); what each step sends to the store is the RowStager's (staging.py).

Order of calls for a step: `plan` (slots; may run before the previous step commits, and may be
abandoned), `flush` (right before the step runs, after the previous step's commit: stages whole
rows and changed cells from the host streams, so an abandoned plan never touches the tables),
the step's ops (planner/ops.py: scatter, gather, run, advance), then `commit`.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from resident.planner.layout import SINK_ROW, WALKS, PoolLayout, ResidentLayout, build_layout
from resident.planner.slots import ResidentPlan, SlotCache
from resident.planner.staging import RowStager, StagedStep
from resident.resources.kv import KVPool
from resident.resources.positions import Positions
from resident.resources.recurrent import StatePool

__all__ = ["SINK_ROW", "PoolLayout", "ResidentLayout", "ResidentPlan", "ResidentPlanner",
           "StagedStep", "build_layout"]

log = logging.getLogger("resident.planner")


class ResidentPlanner:
    def __init__(self, max_bucket: int, pools: dict[str, tuple[KVPool, int, bool]],
                 states: StatePool, positions: Positions, position_pool: str,
                 device: torch.device) -> None:
        """pools: key -> (pool, span, appends), in row order; positions follow position_pool."""
        self.max_bucket = max_bucket
        self.layout = build_layout([(k, span, appends) for k, (_, span, appends) in pools.items()],
                                   position_pool)
        self.num_rows = 2 * max_bucket + 1
        self.slots = SlotCache(self.num_rows)
        self.stager = RowStager(self.layout, self.num_rows, max_bucket,
                                {key: pool for key, (pool, _, _) in pools.items()}, states,
                                positions, device)

    @property
    def store_gpu(self) -> torch.Tensor:
        return self.stager.store_gpu

    @property
    def slot_ids_gpu(self) -> torch.Tensor:
        return self.stager.slot_ids_gpu

    @property
    def cells_gpu(self) -> torch.Tensor:
        return self.stager.cells_gpu

    @property
    def counters(self) -> dict[str, int]:
        return {**self.slots.counters, **self.stager.counters}

    def describe(self) -> str:
        store = self.store_gpu
        mib = store.numel() * store.element_size() / 2**20
        return (f"{self.num_rows - 1} slots of {self.layout.num_cols} cells, {mib:.1f} MiB, "
                f"walks {list(WALKS)}")

    def plan(self, request_ids: list[str], bucket: int) -> ResidentPlan:
        """Gives every row a slot (slots.py); changes nothing if it raises."""
        if not 0 < len(request_ids) <= bucket <= self.max_bucket:
            raise ValueError(f"a resident step of {len(request_ids)} rows in bucket {bucket} "
                             f"(widest {self.max_bucket})")
        return self.slots.plan(request_ids, bucket)

    def flush(self, plan: ResidentPlan) -> StagedStep:
        """Stages the plan's whole rows (new, displaced, stale) and changed cells (page
        crossings, refreshed lengths) from the host streams (staging.py)."""
        _expect(plan, "planned")
        staged = self.stager.flush(plan, self.slots.whole_rows(plan))
        plan.state = "flushed"
        return staged

    def commit(self, plan: ResidentPlan) -> None:
        """The step ran: the mirror's lengths advance as the device's did, and slots whose
        last reader this was return."""
        _expect(plan, "flushed")
        self.stager.advance(plan)
        plan.state = "committed"
        self.slots.committed(plan)

    def abandon(self, plan: ResidentPlan) -> None:
        """A plan that will not run (never flushed): its new slots go back unread."""
        _expect(plan, "planned")
        plan.state = "abandoned"
        self.slots.abandon(plan)

    def release(self, request_id: str, offload: bool = False) -> None:
        """A request finished, was aborted or offloaded: its slot cools until the last step
        that read it commits."""
        self.slots.release(request_id, offload)

    def mark_stale(self, request_ids) -> None:
        """A host-planned step moved these streams: their rows are written whole next time."""
        self.slots.mark_stale(request_ids)

    def stage_idle(self, bucket: int) -> None:
        self.stager.stage_idle(bucket)

    def slot_of(self, request_id: str) -> int | None:
        return self.slots.slot_of(request_id)

    def ledger(self) -> dict[str, set[int]]:
        return self.slots.ledger()

    def holders(self) -> dict[str, int]:
        """Request id -> the slot it holds."""
        return self.slots.holders()

    def sink_row(self) -> np.ndarray:
        return self.stager.sink_row()


def _expect(plan: ResidentPlan, state: str) -> None:
    if plan.state != state:
        raise RuntimeError(f"plan {plan.seq} is {plan.state}, not {state}")
