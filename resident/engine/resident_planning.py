"""ResidentPlanning (`resident_planning: auto`): decode steps planned by the resident planner.

A decode step's `prepare_decode` is the planner's plan and flush (slots, then the changed cells
and whole rows staged and copied, resident/planner/); `upload_decode` sends only the token ids
(and fa2's host plan under `flashinfer`, from host lengths, as fa2 needs on Hopper); the
bucket's forward runs between the resident ops (planner/ops.py: scatter the staged cells,
gather the rows, and after it advance the lengths), recorded in its graph; `commit` advances
the planner's mirror and, under `row_check`, checks what the step read (rowcheck.py). A prefill
or mixed step is host-planned and marks its rows stale, so they are written whole when they next
decode; an offload gives the slot up.
"""

from __future__ import annotations

from typing import Any

from resident.backends import StepKernels
from resident.engine.buffers import DecodeInputs, SampledTokens
from resident.engine.inputs import StepInputs
from resident.engine.phases import PhaseTiming
from resident.engine.planning import PreparedStep, StepPlanning
from resident.engine.scheduler import StepPlan
from resident.planner import ResidentPlanner
from resident.planner.ops import ResidentOps
from resident.planner.rowcheck import RowCheck


class ResidentPlanning(StepPlanning):
    mode = "resident"

    def __init__(self, planner: ResidentPlanner, inputs: StepInputs, kernels: StepKernels,
                 phases: PhaseTiming, row_check: RowCheck | None, reason: str) -> None:
        """With the Triton kernels (on CUDA, or the `triton` backend in the interpreter) the
        resident ops are the Triton kernels, else the torch references."""
        self.planner, self.inputs, self.kernels, self.phases = planner, inputs, kernels, phases
        self.row_check = row_check
        device = planner.store_gpu.device
        use_triton = device.type == "cuda" or kernels.decode.name == "triton"
        self.ops = ResidentOps(planner, inputs.page_size, use_triton)
        self.reason = reason

    def prepare_decode(self, plan: StepPlan) -> PreparedStep:
        request_ids = [request.request_id for request in plan.sampling]
        resident = self.planner.plan(request_ids, self.inputs.bucket_for(len(request_ids)))
        staged = self.planner.flush(resident)
        self.phases.lap("resident")
        return PreparedStep(plan, staged.bucket, staged.width, resident, staged)

    def upload_decode(self, prepared: PreparedStep, sampled: SampledTokens | None) -> None:
        plan, bucket = prepared.plan, prepared.bucket
        self.inputs.upload_ids(plan, bucket, sampled)
        if self.kernels.decode.host_plan:  # fa2 plans from host lengths, as on Hopper
            width = self.inputs.stage_host_tables(plan, bucket)
            self.phases.lap("kv_plan")
            self.inputs.plan_attention(plan, bucket, width)

    def before_forward(self, bucket: int, width: int) -> None:
        buf = self.inputs.buffers
        rows = DecodeInputs.of(buf.decode_gpu, bucket)
        self.ops.before(bucket, width, buf.block_tables_gpu[:bucket, :width], rows.positions,
                        rows.kv_write_loc, rows.state_slots)

    def after_forward(self, bucket: int) -> None:
        self.ops.after(bucket)

    def stage_idle(self, bucket: int) -> None:
        self.planner.stage_idle(bucket)

    def capture_width(self, max_pages: int) -> int:
        """A row holds at most its pool's span, fewer than max_pages when the KV pool is small."""
        layout = self.planner.layout
        return min(max_pages, layout.pool(layout.position_pool).span)

    def commit(self, prepared: PreparedStep) -> None:
        plan = prepared.plan
        if not prepared.is_decode:  # a host-planned step moved these streams
            self.planner.mark_stale(row.request.request_id for row in plan.rows)
        else:
            self.planner.commit(prepared.resident)
            if self.row_check:
                meta = self.inputs.decode_meta(prepared.bucket, prepared.width)
                rows = [row.request.request_id for row in plan.rows]
                self.row_check.check(rows, prepared.resident, meta)  # what the step read
        self.phases.lap("resident")

    def release(self, request_id: str, offload: bool = False) -> None:
        self.planner.release(request_id, offload)

    def counters(self) -> dict[str, Any]:
        counts = self.row_check.counts if self.row_check else {}
        return {**self.planner.counters, **{key: counts.get(key, 0)
                                            for key in ("steps", "rows", "mismatches")}}
