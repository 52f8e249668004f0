"""StepInputs: a step's inputs built on the host from the streams and uploaded into the fixed
buffers (buffers.py), and the host plans the kernel backends need from them.

- **Varlen steps** (prefill and mixed): varlen.py (`self.varlen`), padded to a prefill bucket
  under `padded_prefill`.
- **Decode steps** (host-planned): a bucket's positions, write locations and state slots sit
  side by side in one block (DecodeInputs) and upload with the block-table rows when the step is
  prepared (`stage_decode`, `upload_decode`); its token ids upload when it launches
  (`upload_ids`), since under `plan_ahead` a step is prepared while the one before it runs and
  its ids are not read back yet. Padding rows point at the sink page and slot.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch

from resident.backends import PagedLayout, StepKernels
from resident.backends.layout import table_layout
from resident.config import EngineConfig
from resident.engine.buffers import (
    Capacity,
    DecodeInputs,
    SampledTokens,
    StepBuffers,
    copy_all,
    ids_from_sampled,
    sampled_sources,
)
from resident.engine.phases import PhaseTiming
from resident.engine.scheduler import StepPlan
from resident.engine.varlen import VarlenInputs, fill_tables, stage_one_token_rows
from resident.model.step import GDN_CHUNK, StepMeta
from resident.resources.kv import SINK_PAGE, KVPool
from resident.resources.positions import Positions
from resident.resources.recurrent import SINK_SLOT, StatePool


class StepInputs:
    def __init__(self, config: EngineConfig, kv: KVPool, states: StatePool,
                 positions: Positions, kernels: StepKernels, phases: PhaseTiming,
                 device: torch.device) -> None:
        self.config, self.page_size = config, config.page_size
        self.kv, self.states, self.positions = kv, states, positions
        self.kernels, self.phases = kernels, phases
        self.max_pages = -(-config.max_model_len // config.page_size)
        tokens = config.max_step_tokens
        capacity = Capacity(tokens, config.max_step_rows, self.max_pages,
                            config.max_prefill_rows,
                            tokens // GDN_CHUNK + config.max_prefill_rows + 2)
        self.buffers = StepBuffers(capacity, device)
        self.varlen = VarlenInputs(config, self.buffers, kv, states, positions, kernels, phases)
        self.host = self.buffers.next_host()  # the ring entry the decode staging last wrote

    def bucket_for(self, num_rows: int) -> int:
        """The smallest decode bucket that holds num_rows."""
        buckets = self.config.decode_buckets
        return buckets[bisect.bisect_left(buckets, num_rows)]

    def stage_decode(self, plan: StepPlan, bucket: int) -> int:
        """A decode step's rows (one token each) then padding rows, staged with one list per
        array: this is the host plan's hot loop at high concurrency. Returns the block-table
        width."""
        num_rows = len(plan.rows)
        self.host = self.buffers.next_host()
        host = DecodeInputs.of(self.host.decode, bucket)
        # a decode plan's rows all sample: its sampling list is its rows' requests
        page_lists = stage_one_token_rows(host, plan.sampling, self.kv,
                                          self.states, self.positions, self.phases)
        width = self._stage_tables(page_lists, bucket)
        self.phases.lap("kv_plan")
        padding = slice(num_rows, bucket)
        host.positions[padding] = 0
        host.kv_write_loc[padding] = SINK_PAGE * self.page_size
        host.state_slots[padding] = SINK_SLOT
        self.phases.lap("declare_admit_pad")
        return width

    def stage_host_tables(self, plan: StepPlan, bucket: int) -> int:
        """Only the block-table rows of a decode step, for a host attention plan of a step
        whose rows are otherwise planned on the device (resident planning under fa2)."""
        self.host = self.buffers.next_host()
        kv = self.kv
        return self._stage_tables([kv.streams[row.request.request_id].pages for row in plan.rows],
                                  bucket)

    def _stage_tables(self, page_lists: list[list[int]], bucket: int) -> int:
        """Block-table rows, then padding rows on the sink page; returns the width."""
        tables = self.host.block_tables
        width = fill_tables(tables, page_lists)
        tables[len(page_lists):bucket, 0] = SINK_PAGE
        return width

    def upload_decode(self, bucket: int) -> None:
        """A decode bucket's two copies: its inputs block past the token ids (which upload at
        launch, upload_ids) and its whole block-table rows (columns past a row's pages are
        never read; a [rows, width] slice would make torch stage it through temporaries)."""
        buf, host = self.buffers, self.host
        copy_all([(buf.decode_gpu[bucket:4 * bucket], host.decode[bucket:4 * bucket]),
                  (buf.block_tables_gpu[:bucket], host.block_tables[:bucket])])
        self.phases.lap("kv_stage")

    def upload_ids(self, plan: StepPlan, bucket: int, sampled: SampledTokens | None) -> None:
        """The decode rows' last tokens (then padding) into the bucket's input ids: from the
        host, or for rows the last step sampled and has not read back, from its tokens on the
        device (one copy when they lead in the same order, else a gather)."""
        num_rows, buf = len(plan.rows), self.buffers
        host = buf.next_host("ids")
        sources = sampled_sources(plan.rows, sampled)
        host_ids = host.decode_ids[:bucket]
        host_ids[:num_rows] = [0 if source >= 0 else row.request.output_ids[-1]
                               for row, source in zip(plan.rows, sources, strict=True)]
        host_ids[num_rows:] = 0
        self.phases.lap("declare_admit_pad")
        ids_gpu = DecodeInputs.input_ids_of(buf.decode_gpu, bucket)
        ids_gpu.copy_(torch.from_numpy(host_ids), non_blocking=True)
        ids_from_sampled(ids_gpu, sources, sampled, host.id_rows, buf.id_rows_gpu,
                         buf.id_values_gpu)
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

    def host_layout(self, plan: StepPlan, num_rows: int, width: int,
                    tables: np.ndarray | None = None) -> PagedLayout:
        """FlashInfer's page lists from the block tables staged on the host (the decode
        staging's, or `tables`): the plan's rows, then padding rows (one token on the sink) up
        to num_rows."""
        count = len(plan.rows)
        kv_lens = np.ones(num_rows, np.int64)
        q_lens = np.ones(num_rows, np.int64)
        kv_lens[:count] = [row.request.num_computed + row.num_new for row in plan.rows]
        q_lens[:count] = [row.num_new for row in plan.rows]
        tables = self.host.block_tables if tables is None else tables
        return table_layout(tables[:num_rows, :width], kv_lens, q_lens, self.page_size)
