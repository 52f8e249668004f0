"""StepInputs: a step's inputs built on the host from the streams and uploaded into the fixed
buffers (buffers.py), and the host plans the kernel backends need from them.

- **Varlen steps** (prefill and mixed): each row's tokens, positions, KV write locations,
  block-table row and state slot are staged row by row, then uploaded. A prefill of one fresh
  row (nothing computed yet, at most the largest of `prefill_buckets` tokens) is padded to the
  smallest prefill bucket that holds it: padding tokens write their K/V to the sink page, sit
  after the row's end (query_start_loc [0, n]) and run on the prefill backend's `fresh_ops`,
  which keep them out of the row's attention, conv window and GDN state; fixed shapes and no
  host plan, so each bucket can be a captured graph.
- **Decode steps** (host-planned): a bucket's positions, write locations and state slots sit
  side by side in one block (DecodeInputs) and upload with the block-table rows when the step is
  prepared (`stage_decode`, `upload_decode`); its token ids upload when it launches
  (`upload_ids`), since under `plan_ahead` a step is prepared while the one before it runs and
  its ids are not read back yet. Padding rows point at the sink page and slot.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import torch

from resident.backends import PagedLayout, PrefillStep, StepKernels
from resident.backends.layout import table_layout
from resident.config import EngineConfig
from resident.engine.buffers import DecodeInputs, SampledTokens, StepBuffers, copy_all
from resident.engine.phases import PhaseTiming
from resident.engine.request import Request
from resident.engine.scheduler import StepPlan
from resident.model.ops import ModelOps
from resident.model.step import StepMeta
from resident.resources.kv import SINK_PAGE, KVPool
from resident.resources.positions import Positions
from resident.resources.recurrent import SINK_SLOT, StatePool


@dataclass(frozen=True)
class VarlenInputs:
    """A staged and uploaded varlen step."""

    num_tokens: int
    num_rows: int
    width: int  # block-table columns its rows use
    num_sampling: int  # rows that sample: the logits rows, in row order
    fresh_bucket: int | None  # the prefill bucket a fresh row was padded to, if it was


class StepInputs:
    def __init__(self, config: EngineConfig, kv: KVPool, states: StatePool,
                 positions: Positions, kernels: StepKernels, phases: PhaseTiming,
                 device: torch.device) -> None:
        self.config, self.page_size = config, config.page_size
        self.kv, self.states, self.positions = kv, states, positions
        self.kernels, self.phases = kernels, phases
        self.max_pages = -(-config.max_model_len // config.page_size)
        max_tokens = config.prefill_token_budget + config.max_decode_rows
        self.buffers = StepBuffers(max_tokens, config.max_step_rows, self.max_pages, device)

    def bucket_for(self, num_rows: int) -> int:
        """The smallest decode bucket that holds num_rows."""
        buckets = self.config.decode_buckets
        return buckets[bisect.bisect_left(buckets, num_rows)]

    def prefill_bucket_for(self, plan: StepPlan) -> int | None:
        """The prefill bucket of a step of one fresh row, or None for any other varlen step."""
        buckets = self.config.prefill_buckets
        if plan.kind != "prefill" or len(plan.rows) != 1 or not buckets:
            return None
        row = plan.rows[0]
        if row.request.num_computed or row.num_new > buckets[-1]:
            return None
        return buckets[bisect.bisect_left(buckets, row.num_new)]

    # -- varlen steps -----------------------------------------------------------------------

    def stage_varlen(self, plan: StepPlan) -> VarlenInputs:
        """Stages and uploads a prefill or mixed step's rows (padded to its prefill bucket if
        it is one fresh row)."""
        buf, phases = self.buffers, self.phases
        num_tokens, width, num_sampling = 0, 1, 0
        buf.query_start_loc_cpu[0] = 0
        for row_index, row in enumerate(plan.rows):
            width = max(width, self._stage_row(row_index, num_tokens, row.num_new, row.request))
            num_tokens += row.num_new
            if row.samples:
                buf.logits_indices_cpu[num_sampling] = num_tokens - 1
                num_sampling += 1
        phases.lap("kv_plan")  # a varlen step stages each row's arrays in one loop
        bucket = self.prefill_bucket_for(plan)
        if bucket is not None:
            self.pad_fresh(num_tokens, bucket)
            phases.lap("declare_admit_pad")
            self._upload_varlen(bucket, 1, 1)
        else:
            self._upload_varlen(num_tokens, len(plan.rows), num_sampling)
        phases.lap("kv_stage")
        return VarlenInputs(num_tokens, len(plan.rows), width, num_sampling, bucket)

    def _stage_row(self, row_index: int, first: int, num_new: int, request: Request) -> int:
        buf, rid = self.buffers, request.request_id
        start = request.num_computed
        end = first + num_new
        pages = np.asarray(self.kv.streams[rid].pages, dtype=np.int64)
        index = np.arange(start, start + num_new)
        buf.input_ids_cpu[first:end] = request.next_tokens(num_new)
        buf.positions_cpu[first:end] = self.positions.position(rid, start) + np.arange(num_new)
        buf.token_seq_cpu[first:end] = row_index
        buf.kv_write_loc_cpu[first:end] = (pages[index // self.page_size] * self.page_size
                                          + index % self.page_size)
        buf.block_tables_cpu[row_index, :len(pages)] = pages
        buf.state_slots_cpu[row_index] = self.states.slots[rid]
        buf.query_start_loc_cpu[row_index + 1] = end
        return len(pages)

    def pad_fresh(self, num_tokens: int, bucket: int) -> None:
        """Padding tokens num_tokens..bucket-1 after a fresh row's staged tokens (or the whole
        bucket, on the sink slot, for a capture); one logits row even if the row samples
        none (the caller drops it)."""
        buf, padding = self.buffers, slice(num_tokens, bucket)
        buf.input_ids_cpu[padding] = 0
        buf.positions_cpu[padding] = 0
        buf.token_seq_cpu[padding] = 0
        buf.kv_write_loc_cpu[padding] = SINK_PAGE * self.page_size
        buf.query_start_loc_cpu[:2] = 0, num_tokens
        buf.logits_indices_cpu[0] = max(num_tokens - 1, 0)
        if num_tokens == 0:
            buf.state_slots_cpu[0] = SINK_SLOT

    def stage_idle_fresh(self, bucket: int) -> None:
        """An all-padding prefill bucket on the sink, for its graph's capture."""
        self.pad_fresh(0, bucket)
        self._upload_varlen(bucket, 1, 1)

    def _upload_varlen(self, num_tokens: int, num_rows: int, num_logits: int) -> None:
        buf = self.buffers
        names = ["input_ids", "positions", "kv_write_loc", "token_seq"]
        copies = [(getattr(buf, f"{n}_gpu")[:num_tokens], getattr(buf, f"{n}_cpu")[:num_tokens])
                  for n in names]
        copies += [
            (buf.state_slots_gpu[:num_rows], buf.state_slots_cpu[:num_rows]),
            (buf.query_start_loc_gpu[:num_rows + 1], buf.query_start_loc_cpu[:num_rows + 1]),
            (buf.logits_indices_gpu[:num_logits], buf.logits_indices_cpu[:num_logits]),
        ]
        copy_all(copies + [self._table_rows(num_rows)])

    def prefill_ops(self, plan: StepPlan, varlen: VarlenInputs) -> ModelOps:
        """A varlen step's ops, with the prefill backend's host plan (attention, fla's varlen
        metadata) made for it."""
        rows = varlen.num_rows
        prefill = self.kernels.prefill
        layout = self.host_layout(plan, rows, varlen.width) if prefill.needs_layout else None
        ops = prefill.ops(PrefillStep(self.buffers.query_start_loc_cpu[:rows + 1].copy(), layout))
        self.phases.lap("attention")
        return ops

    def varlen_meta(self, varlen: VarlenInputs) -> StepMeta:
        buf, rows = self.buffers, varlen.num_rows
        max_query_len = int(np.diff(buf.query_start_loc_cpu[:rows + 1]).max())
        return self._varlen_meta(varlen.num_tokens, rows, varlen.width, varlen.num_sampling,
                                 max_query_len)

    def fresh_meta(self, bucket: int) -> StepMeta:
        """A prefill bucket's StepMeta over the fixed buffers: one row, bucket tokens (the
        block-table width is unread: fresh_ops attend over the row's own keys)."""
        return self._varlen_meta(bucket, 1, 1, 1, max_query_len=bucket)

    def _varlen_meta(self, num_tokens: int, num_rows: int, width: int, num_logits: int,
                     max_query_len: int) -> StepMeta:
        buf = self.buffers
        return StepMeta(
            positions=buf.positions_gpu[:num_tokens],
            token_seq=buf.token_seq_gpu[:num_tokens],
            query_start_loc=buf.query_start_loc_gpu[:num_rows + 1],
            block_tables=buf.block_tables_gpu[:num_rows, :width],
            kv_write_loc=buf.kv_write_loc_gpu[:num_tokens],
            state_slots=buf.state_slots_gpu[:num_rows],
            logits_indices=buf.logits_indices_gpu[:num_logits],
            max_query_len=max_query_len,
        )

    # -- decode steps -----------------------------------------------------------------------

    def stage_decode(self, plan: StepPlan, bucket: int) -> int:
        """A decode step's rows (one token each) then padding rows, staged with one list per
        array rather than row by row: this is the host plan's hot loop at high concurrency.
        Returns the block-table width."""
        page_size, num_rows, phases = self.page_size, len(plan.rows), self.phases
        host = DecodeInputs.of(self.buffers.decode_cpu, bucket)
        requests = [row.request for row in plan.rows]
        ids = [r.request_id for r in requests]
        starts = [r.num_computed for r in requests]
        phases.lap("rest")
        host.positions[:num_rows] = [self.positions.position(rid, start)
                                     for rid, start in zip(ids, starts, strict=True)]
        phases.lap("positions")
        page_lists = [self.kv.streams[rid].pages for rid in ids]
        host.kv_write_loc[:num_rows] = [
            pages[start // page_size] * page_size + start % page_size
            for pages, start in zip(page_lists, starts, strict=True)]
        width = self.stage_tables(page_lists, bucket)
        phases.lap("kv_plan")
        host.state_slots[:num_rows] = [self.states.slots[rid] for rid in ids]
        phases.lap("gdn_linear")
        padding = slice(num_rows, bucket)
        host.positions[padding] = 0
        host.kv_write_loc[padding] = SINK_PAGE * page_size
        host.state_slots[padding] = SINK_SLOT
        phases.lap("declare_admit_pad")
        return width

    def stage_tables(self, page_lists: list[list[int]], bucket: int) -> int:
        """Block-table rows, then padding rows on the sink page; returns the width."""
        tables = self.buffers.block_tables_cpu
        for row_index, pages in enumerate(page_lists):
            tables[row_index, :len(pages)] = pages
        tables[len(page_lists):bucket, 0] = SINK_PAGE
        return max(map(len, page_lists), default=1)

    def upload_decode(self, bucket: int) -> None:
        """A decode bucket's two copies: its inputs block past the token ids (which upload at
        launch, upload_ids) and its block-table rows."""
        buf = self.buffers
        copy_all([(buf.decode_gpu[bucket:4 * bucket], buf.decode_cpu[bucket:4 * bucket]),
                  self._table_rows(bucket)])
        self.phases.lap("kv_stage")

    def _table_rows(self, num_rows: int) -> tuple[torch.Tensor, np.ndarray]:
        """Whole rows, so the copy is one contiguous run (columns past a row's pages are never
        read); a [rows, width] slice would make torch stage it through temporaries."""
        buf = self.buffers
        return buf.block_tables_gpu[:num_rows], buf.block_tables_cpu[:num_rows]

    def upload_ids(self, plan: StepPlan, bucket: int, sampled: SampledTokens | None) -> None:
        """The decode rows' last tokens (then padding) into the bucket's input ids: from the
        host, or for rows the last step sampled and has not read back, from its tokens on the
        device (one copy when they lead in the same order, else a gather)."""
        num_rows, buf = len(plan.rows), self.buffers
        sources = [sampled.index_of.get(row.request.request_id, -1) if sampled else -1
                   for row in plan.rows]
        host_ids = buf.decode_ids_cpu[:bucket]
        host_ids[:num_rows] = [0 if source >= 0 else row.request.output_ids[-1]
                               for row, source in zip(plan.rows, sources, strict=True)]
        host_ids[num_rows:] = 0
        self.phases.lap("declare_admit_pad")
        ids_gpu = DecodeInputs.input_ids_of(buf.decode_gpu, bucket)
        ids_gpu.copy_(torch.from_numpy(host_ids), non_blocking=True)
        moved = [(row, source) for row, source in enumerate(sources) if source >= 0]
        if moved and sources[:len(moved)] == list(range(len(moved))):
            ids_gpu[:len(moved)].copy_(sampled.tokens_gpu[:len(moved)])
        elif moved:
            count = len(moved)
            rows_cpu, rows_gpu = buf.id_rows_cpu[:2 * count], buf.id_rows_gpu[:2 * count]
            rows_cpu[:] = np.array(moved).T.reshape(-1)
            rows_gpu.copy_(torch.from_numpy(rows_cpu), non_blocking=True)
            values = buf.id_values_gpu[:count]
            torch.index_select(sampled.tokens_gpu, 0, rows_gpu[count:], out=values)
            ids_gpu.index_copy_(0, rows_gpu[:count], values)
        self.phases.lap("kv_stage")

    def plan_attention(self, plan: StepPlan, bucket: int, width: int) -> None:
        """The decode backend's host plan, if it needs one, from tables staged on the host."""
        decode = self.kernels.decode
        if decode.host_plan:
            decode.plan_decode(bucket, self.host_layout(plan, bucket, width))
        self.phases.lap("attention")

    def decode_meta(self, bucket: int, width: int) -> StepMeta:
        """A decode bucket's StepMeta over the fixed buffers: what its graph reads."""
        buf = self.buffers
        inputs = DecodeInputs.of(buf.decode_gpu, bucket)
        return StepMeta(
            positions=inputs.positions,
            token_seq=buf.arange_gpu[:bucket],
            query_start_loc=buf.arange_gpu[:bucket + 1],
            block_tables=buf.block_tables_gpu[:bucket, :width],
            kv_write_loc=inputs.kv_write_loc,
            state_slots=inputs.state_slots,
            logits_indices=buf.arange_gpu[:bucket],
            max_query_len=1,
        )

    def host_layout(self, plan: StepPlan, num_rows: int, width: int) -> PagedLayout:
        """FlashInfer's page lists from the staged host tables: the plan's rows, then padding
        rows (one token on the sink) up to num_rows."""
        count = len(plan.rows)
        kv_lens = np.ones(num_rows, np.int64)
        q_lens = np.ones(num_rows, np.int64)
        kv_lens[:count] = [row.request.num_computed + row.num_new for row in plan.rows]
        q_lens[:count] = [row.num_new for row in plan.rows]
        return table_layout(self.buffers.block_tables_cpu[:num_rows, :width], kv_lens, q_lens,
                            self.page_size)
