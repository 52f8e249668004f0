"""StepRunner: the host-planned step. Fills fixed-address buffers from the host streams, runs the
forward, and moves requests' device state in and out of host memory.

Every step rebuilds each row's tokens, positions, block-table row, KV write locations and state
slot into host staging arrays (numpy views of pinned memory on CUDA), then copies what the step
uses into device buffers that never move, so a captured graph can read them. A decode-only step
pads to the smallest decode bucket that holds it; padding rows point at the sink page and slot.
Its four per-row arrays sit side by side in one bucket-sized block (DecodeInputs), so a decode
step uploads in three contiguous copies: that block and the block-table rows when it is
prepared (prepare_decode), its token ids when it is launched (upload_decode), since under
`plan_ahead` a step is prepared while the one before it runs and its ids are not read back yet
(under `plan_ahead=launch` they are gathered on the device from that step's sampled tokens).
With `cuda_graphs` on, each bucket's forward is a captured graph (graphs.py) replayed after the
host staging and, for a host-planned attention backend, the attention plan.

A prefill step of one fresh row (nothing computed yet, at most the largest of `prefill_buckets`
tokens) is staged like any varlen step, then padded to the smallest prefill bucket that holds
it: padding tokens write their K/V to the sink page, sit after the row's end (query_start_loc
[0, n]) and run on the prefill backend's `fresh_ops`, which keep them out of the row's attention,
conv window and GDN state. Fixed shapes and no host plan, so under `cuda_graphs` each prefill
bucket is a captured graph as well: a fresh prefill is otherwise host-bound (~45 ms of host time
for 3.6 ms of GPU work at 512 tokens on the 0.8B, results/2026-11-29-h200-0.8b-decode-gemm).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import torch

from resident.backends import PagedLayout, PrefillStep, StepKernels
from resident.backends.layout import table_layout
from resident.config import EngineConfig
from resident.engine.graphs import StepGraphs
from resident.engine.phases import NO_PHASES, NoPhases, PhaseTiming
from resident.engine.request import Request
from resident.engine.resident_ops import ResidentOps
from resident.engine.scheduler import StepPlan
from resident.model.cache import ModelCache
from resident.model.ops import ModelOps
from resident.model.qwen3_5 import Qwen3_5ForCausalLM
from resident.model.step import StepMeta
from resident.planner import ResidentPlanner, StagedStep
from resident.resources.kv import SINK_PAGE, KVPool
from resident.resources.positions import Positions
from resident.resources.recurrent import SINK_SLOT, StatePool


@dataclass(frozen=True)
class HostCopy:
    """An offloaded request's device state in host memory."""

    kv: torch.Tensor  # [num_attention_layers, num_pages, 2, page_size, Hkv, D]
    conv: torch.Tensor  # [num_linear_layers, conv_dim, conv_kernel]
    recurrent: torch.Tensor  # [num_linear_layers, Hv, Dk, Dv]


@dataclass(frozen=True)
class DecodeInputs:
    """A decode bucket's per-row inputs: views of one [4 * bucket] block (flat[:4 * bucket],
    these four in this order), device or host."""

    input_ids: torch.Tensor | np.ndarray  # [bucket]
    positions: torch.Tensor | np.ndarray
    kv_write_loc: torch.Tensor | np.ndarray
    state_slots: torch.Tensor | np.ndarray

    @classmethod
    def of(cls, flat, bucket: int) -> DecodeInputs:
        return cls(*(flat[i * bucket:(i + 1) * bucket] for i in range(4)))

    @staticmethod
    def input_ids_of(flat, bucket: int):
        """`of(flat, bucket).input_ids` without building the other three views (a step's
        token ids upload on their own, at launch)."""
        return flat[:bucket]


@dataclass(frozen=True)
class SampledTokens:
    """A step's sampled tokens still on the device, for the next step's token ids when it
    launches before they are read back (plan_ahead=launch)."""

    tokens_gpu: torch.Tensor  # [rows], in the order of index_of
    index_of: dict[str, int]  # request id -> its row in tokens_gpu


class StepBuffers:
    """Fixed-address device buffers a step reads, and their host staging twins."""

    def __init__(self, max_tokens: int, max_rows: int, max_pages: int, device: torch.device):
        pin = device.type == "cuda"

        def pair(*shape: int, dtype=torch.int64) -> tuple[torch.Tensor, np.ndarray]:
            host = torch.zeros(shape, dtype=dtype, pin_memory=pin)
            return torch.zeros(shape, dtype=dtype, device=device), host.numpy()

        # a decode bucket's inputs (DecodeInputs): each bucket reads its own fixed views. The
        # token ids upload from their own host array, at launch, once read back: a step staged
        # ahead writes the block while the last step's ids may still be in flight
        self.decode_gpu, self.decode_cpu = pair(4 * max_rows)
        self.decode_ids_cpu = torch.zeros(max_rows, dtype=torch.int64, pin_memory=pin).numpy()
        # rows whose ids come from the last step's tokens on the device: k destinations then
        # k sources, contiguous
        self.id_rows_gpu, self.id_rows_cpu = pair(2 * max_rows)
        self.id_values_gpu = torch.zeros(max_rows, dtype=torch.int64, device=device)

        self.input_ids_gpu, self.input_ids_cpu = pair(max_tokens)
        self.positions_gpu, self.positions_cpu = pair(max_tokens)
        self.token_seq_gpu, self.token_seq_cpu = pair(max_tokens)
        self.kv_write_loc_gpu, self.kv_write_loc_cpu = pair(max_tokens)
        self.query_start_loc_gpu, self.query_start_loc_cpu = pair(max_rows + 1)
        self.state_slots_gpu, self.state_slots_cpu = pair(max_rows)
        self.logits_indices_gpu, self.logits_indices_cpu = pair(max_rows)
        self.block_tables_gpu, self.block_tables_cpu = pair(max_rows, max_pages,
                                                            dtype=torch.int32)


class StepRunner:
    """Plans steps on the host into fixed buffers and executes them; also the Swapper."""

    def __init__(self, model: Qwen3_5ForCausalLM, cache: ModelCache, config: EngineConfig,
                 kv: KVPool, states: StatePool, positions: Positions,
                 kernels: StepKernels, planner: ResidentPlanner | None = None,
                 phases: PhaseTiming | NoPhases = NO_PHASES) -> None:
        """With a planner, every decode bucket runs the resident ops around its forward
        (resident_ops.py), in its graph under cuda_graphs. `phases` gets a lap at each seam
        of a step's plan (phases.py)."""
        self.model, self.cache, self.config = model, cache, config
        self.phases = phases
        self.kv, self.states, self.positions = kv, states, positions
        self.kernels = kernels
        self.device = cache.kv.device
        self.planner = planner
        use_triton = self.device.type == "cuda" or kernels.decode.name == "triton"
        self.resident_ops = (ResidentOps(planner, config.page_size, use_triton)
                             if planner else None)
        self.page_size = config.page_size
        max_rows = config.max_step_rows
        max_tokens = config.prefill_token_budget + config.max_decode_rows
        self.max_pages = -(-config.max_model_len // config.page_size)
        self.buffers = StepBuffers(max_tokens, max_rows, self.max_pages, self.device)
        # a decode step's rows are 0..b-1, one token each: token rows, query starts and logits
        # rows are all this range, fixed for the step's bucket
        self.arange_gpu = torch.arange(max_rows + 1, device=self.device)
        graphs = config.cuda_graphs == "on"
        self.graphs = StepGraphs("decode") if graphs else None
        self.prefill_graphs = StepGraphs("prefill") if graphs else None
        self._host_copies: dict[str, HostCopy] = {}
        self.num_padded_prefills = 0

    # -- planning ---------------------------------------------------------------------------

    def bucket_for(self, num_rows: int) -> int:
        buckets = self.config.decode_buckets
        return buckets[bisect.bisect_left(buckets, num_rows)]

    def _stage(self, plan: StepPlan) -> tuple[int, int, int]:
        """Stages a varlen step's rows into the host arrays. Returns (tokens, block-table
        width, sampling rows); the logits rows are the sampling rows in order."""
        buf = self.buffers
        token, width, num_sampling = 0, 1, 0
        buf.query_start_loc_cpu[0] = 0
        for row_index, row in enumerate(plan.rows):
            width = max(width, self._stage_row(row_index, token, row.num_new, row.request))
            token += row.num_new
            if row.samples:
                buf.logits_indices_cpu[num_sampling] = token - 1
                num_sampling += 1
        return token, width, num_sampling

    def prefill_bucket_for(self, plan: StepPlan) -> int | None:
        """The prefill bucket of a step of one fresh row, or None for any other varlen step."""
        buckets = self.config.prefill_buckets
        if plan.kind != "prefill" or len(plan.rows) != 1 or not buckets:
            return None
        row = plan.rows[0]
        if row.request.num_computed or row.num_new > buckets[-1]:
            return None
        return buckets[bisect.bisect_left(buckets, row.num_new)]

    def _pad_fresh(self, num_tokens: int, bucket: int) -> None:
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

    def _stage_decode(self, plan: StepPlan, bucket: int) -> int:
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
        width = self._stage_tables(page_lists, bucket)
        phases.lap("kv_plan")
        host.state_slots[:num_rows] = [self.states.slots[rid] for rid in ids]
        phases.lap("gdn_linear")
        padding = slice(num_rows, bucket)
        host.positions[padding] = 0
        host.kv_write_loc[padding] = SINK_PAGE * page_size
        host.state_slots[padding] = SINK_SLOT
        phases.lap("declare_admit_pad")
        return width

    def _stage_tables(self, page_lists: list[list[int]], bucket: int) -> int:
        """Block-table rows, then padding rows on the sink page; returns the width."""
        tables = self.buffers.block_tables_cpu
        for row_index, pages in enumerate(page_lists):
            tables[row_index, :len(pages)] = pages
        tables[len(page_lists):bucket, 0] = SINK_PAGE
        return max(map(len, page_lists), default=1)

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

    def _upload(self, num_tokens: int, num_rows: int, num_logits: int) -> None:
        """Copies the staged host arrays a varlen step reads."""
        buf = self.buffers
        names = ["input_ids", "positions", "kv_write_loc", "token_seq"]
        copies = [(getattr(buf, f"{n}_gpu")[:num_tokens], getattr(buf, f"{n}_cpu")[:num_tokens])
                  for n in names]
        copies += [
            (buf.state_slots_gpu[:num_rows], buf.state_slots_cpu[:num_rows]),
            (buf.query_start_loc_gpu[:num_rows + 1], buf.query_start_loc_cpu[:num_rows + 1]),
            (buf.logits_indices_gpu[:num_logits], buf.logits_indices_cpu[:num_logits]),
        ]
        _copy_all(copies + [self._table_rows(num_rows)])

    def _upload_decode(self, bucket: int) -> None:
        """A decode bucket's two copies: its inputs block past the token ids (which upload at
        launch, _upload_ids) and its block-table rows (token rows, query starts and logits
        rows are aranges on the device)."""
        buf = self.buffers
        _copy_all([(buf.decode_gpu[bucket:4 * bucket], buf.decode_cpu[bucket:4 * bucket]),
                   self._table_rows(bucket)])

    def _table_rows(self, num_rows: int) -> tuple[torch.Tensor, np.ndarray]:
        """Whole rows, so the copy is one contiguous run (columns past a row's pages are never
        read); a [rows, width] slice would make torch stage it through temporaries."""
        buf = self.buffers
        return buf.block_tables_gpu[:num_rows], buf.block_tables_cpu[:num_rows]

    def _varlen_meta(self, num_tokens: int, num_rows: int, width: int, num_logits: int,
                     max_query_len: int | None = None) -> StepMeta:
        buf = self.buffers
        if max_query_len is None:
            max_query_len = int(np.diff(buf.query_start_loc_cpu[:num_rows + 1]).max())
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

    def fresh_meta(self, bucket: int) -> StepMeta:
        """A prefill bucket's StepMeta over the fixed buffers: one row, bucket tokens (the
        block-table width is unread: fresh_ops attend over the row's own keys)."""
        return self._varlen_meta(bucket, 1, 1, 1, max_query_len=bucket)

    def decode_meta(self, bucket: int, width: int) -> StepMeta:
        """A decode bucket's StepMeta over the fixed buffers: what its graph reads."""
        inputs = DecodeInputs.of(self.buffers.decode_gpu, bucket)
        return StepMeta(
            positions=inputs.positions,
            token_seq=self.arange_gpu[:bucket],
            query_start_loc=self.arange_gpu[:bucket + 1],
            block_tables=self.buffers.block_tables_gpu[:bucket, :width],
            kv_write_loc=inputs.kv_write_loc,
            state_slots=inputs.state_slots,
            logits_indices=self.arange_gpu[:bucket],
            max_query_len=1,
        )

    def _host_layout(self, plan: StepPlan, num_rows: int, width: int) -> PagedLayout:
        """FlashInfer's page lists from the staged host tables: the plan's rows, then padding
        rows (one token on the sink) up to num_rows."""
        count = len(plan.rows)
        kv_lens = np.ones(num_rows, np.int64)
        q_lens = np.ones(num_rows, np.int64)
        kv_lens[:count] = [row.request.num_computed + row.num_new for row in plan.rows]
        q_lens[:count] = [row.num_new for row in plan.rows]
        return table_layout(self.buffers.block_tables_cpu[:num_rows, :width], kv_lens, q_lens,
                            self.page_size)

    def _plan_attention(self, plan: StepPlan, bucket: int, width: int) -> None:
        """The decode backend's host plan, if it needs one, from tables staged on the host."""
        decode = self.kernels.decode
        if decode.host_plan:
            decode.plan_decode(bucket, self._host_layout(plan, bucket, width))

    # -- the host-planned step --------------------------------------------------------------

    def run(self, plan: StepPlan) -> torch.Tensor:
        """Stages, uploads and runs a prefill or mixed step; [rows, vocab] logits of its
        sampling rows in order. A decode step goes through prepare_decode, then upload_decode
        (or upload_resident) and forward_decode, which the engine may split across steps."""
        if plan.kind == "decode":
            raise ValueError("a decode step runs through prepare_decode, upload_decode and "
                             "forward_decode")
        phases = self.phases
        num_tokens, width, num_sampling = self._stage(plan)
        phases.lap("kv_plan")  # a varlen step stages each row's arrays in one loop
        bucket = self.prefill_bucket_for(plan)
        if bucket is not None:
            self._pad_fresh(num_tokens, bucket)
            self.num_padded_prefills += 1
            phases.lap("declare_admit_pad")
            self._upload(bucket, 1, 1)
            phases.lap("kv_stage")
            return self._launch(self.run_fresh, bucket)[:num_sampling]
        num_rows = len(plan.rows)
        self._upload(num_tokens, num_rows, num_sampling)
        phases.lap("kv_stage")
        prefill = self.kernels.prefill
        layout = self._host_layout(plan, num_rows, width) if prefill.needs_layout else None
        step = PrefillStep(self.buffers.query_start_loc_cpu[:num_rows + 1].copy(), layout)
        ops = prefill.ops(step)  # the attention plan, and fla's varlen metadata
        phases.lap("attention")
        meta = self._varlen_meta(num_tokens, num_rows, width, num_sampling)
        phases.lap("rest")
        return self._launch(self.execute, self.buffers.input_ids_gpu[:num_tokens], meta, ops)

    def prepare_decode(self, plan: StepPlan) -> tuple[int, int]:
        """Stages and uploads a decode step's rows but their token ids (which may not be read
        back yet); returns (bucket, width) for upload_decode and forward_decode."""
        bucket = self.bucket_for(len(plan.rows))
        width = self._stage_decode(plan, bucket)
        self._upload_decode(bucket)
        self.phases.lap("kv_stage")
        return bucket, width

    def upload_decode(self, plan: StepPlan, bucket: int, width: int,
                      sampled: SampledTokens | None = None) -> None:
        """A prepared decode step's token ids and the host attention plan, if any; then
        forward_decode(bucket, width) runs it."""
        self._upload_ids(plan, bucket, sampled)
        self._plan_attention(plan, bucket, width)
        self.phases.lap("attention")

    def forward_decode(self, bucket: int, width: int) -> torch.Tensor:
        return self._launch(self.run_decode, bucket, width)

    def _upload_ids(self, plan: StepPlan, bucket: int, sampled: SampledTokens | None) -> None:
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

    def _launch(self, forward, *args) -> torch.Tensor:
        logits = forward(*args)
        self.phases.lap("launch")
        return logits

    def run_decode(self, bucket: int, width: int) -> torch.Tensor:
        """A decode bucket whose inputs (and host attention plan, if any) are in place: the
        graph's replay or the eager forward."""
        if self.graphs is not None and self.graphs.has(bucket):
            return self.graphs.replay(bucket)
        return self._bucket_forward(bucket, width)

    def _bucket_forward(self, bucket: int, width: int) -> torch.Tensor:
        """The bucket's forward, between the resident ops when planning is resident."""
        if self.resident_ops is None:
            return self._decode_forward(bucket, width)
        device = DecodeInputs.of(self.buffers.decode_gpu, bucket)
        self.resident_ops.before(bucket, width, self.buffers.block_tables_gpu[:bucket, :width],
                                 device.positions, device.kv_write_loc, device.state_slots)
        logits = self._decode_forward(bucket, width)
        self.resident_ops.after(bucket)
        return logits

    def run_fresh(self, bucket: int) -> torch.Tensor:
        """A staged prefill bucket: the graph's replay or the eager forward; [1, vocab]."""
        if self.prefill_graphs is not None and self.prefill_graphs.has(bucket):
            return self.prefill_graphs.replay(bucket)
        return self.execute(self.buffers.input_ids_gpu[:bucket], self.fresh_meta(bucket),
                            self.kernels.prefill.fresh_ops())

    def _decode_forward(self, bucket: int, width: int) -> torch.Tensor:
        meta = self.decode_meta(bucket, width)
        with torch.inference_mode():
            input_ids = DecodeInputs.of(self.buffers.decode_gpu, bucket).input_ids
            hidden = self.model(input_ids, meta, self.cache,
                                self.kernels.decode.ops(bucket))
            return self.model.compute_logits(hidden)

    # -- the resident decode step -----------------------------------------------------------

    def upload_resident(self, plan: StepPlan, staged: StagedStep,
                        sampled: SampledTokens | None = None) -> None:
        """A resident decode step, after planner.flush staged it: its token ids and fa2's host
        plan if the backend needs one; then forward_decode(bucket, staged.width) runs the
        bucket (its graph records scatter, gather, forward and advance)."""
        bucket, phases = staged.slot_ids_gpu.shape[0], self.phases
        self._upload_ids(plan, bucket, sampled)
        if self.kernels.decode.host_plan:  # fa2 plans from host lengths, as on Hopper
            page_lists = [self.kv.streams[row.request.request_id].pages for row in plan.rows]
            width = self._stage_tables(page_lists, bucket)
            phases.lap("kv_plan")
            self._plan_attention(plan, bucket, width)
            phases.lap("attention")

    # -- execution --------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, input_ids: torch.Tensor, meta: StepMeta, ops: ModelOps) -> torch.Tensor:
        """[num_logits, vocab] logits of a varlen step's sampling rows."""
        hidden = self.model(input_ids, meta, self.cache, ops)
        return self.model.compute_logits(hidden[meta.logits_indices])

    # -- CUDA graphs ------------------------------------------------------------------------

    def capture_graphs(self) -> None:
        """Captures every decode bucket (largest first) over the fixed, full-width buffers,
        with the resident ops when there is a planner, then every prefill bucket."""
        planning = "resident" if self.planner else "off"
        decode = self.kernels.decode

        def prepare(bucket: int) -> None:
            empty = StepPlan([], "decode")
            self._stage_decode(empty, bucket)
            self._upload_decode(bucket)
            self._plan_attention(empty, bucket, 1)
            if self.planner:
                self.planner.stage_idle(bucket)

        def describe(bucket: int) -> str:
            free = "no" if decode.host_plan else "yes"
            return f"planning {planning}, host_plan_free {free} ({decode.name})"

        # full width: a replay serves rows of any length. A planner's rows hold at most its
        # span of pages, fewer than max_pages when the KV pool is small
        width = self.max_pages
        if self.planner:
            layout = self.planner.layout
            width = min(width, layout.pool(layout.position_pool).span)
        self.graphs.capture(self.config.decode_buckets, prepare,
                            lambda bucket: self._bucket_forward(bucket, width), describe)
        self.prefill_graphs.capture(self.config.prefill_buckets, self._prepare_fresh,
                                    self.run_fresh, lambda bucket: "one fresh row, no host plan")

    def _prepare_fresh(self, bucket: int) -> None:
        self._pad_fresh(0, bucket)
        self._upload(bucket, 1, 1)

    # -- Swapper ----------------------------------------------------------------------------

    def offload(self, request: Request) -> None:
        rid = request.request_id
        num_pages = self.kv.pages_for(request.num_computed)
        pages = torch.tensor(self.kv.streams[rid].pages[:num_pages], device=self.device)
        slot = self.states.slots[rid]
        pin = self.device.type == "cuda"
        self._host_copies[rid] = HostCopy(
            kv=_to_host(self.cache.kv[:, pages], pin),
            conv=_to_host(self.cache.conv[:, slot], pin),
            recurrent=_to_host(self.cache.recurrent[:, slot], pin),
        )

    def reload(self, request: Request) -> None:
        rid = request.request_id
        copy = self._host_copies.pop(rid)
        pages = torch.tensor(self.kv.streams[rid].pages, device=self.device)
        slot = self.states.slots[rid]
        self.cache.kv[:, pages] = copy.kv.to(self.device, non_blocking=True)
        self.cache.conv[:, slot] = copy.conv.to(self.device, non_blocking=True)
        self.cache.recurrent[:, slot] = copy.recurrent.to(self.device, non_blocking=True)

    def reset_state(self, request: Request) -> None:
        self.cache.reset_slot(self.states.slots[request.request_id])

    def drop(self, request_id: str) -> None:
        """Forgets an offloaded request's host copy (it finished or was aborted)."""
        self._host_copies.pop(request_id, None)


def _copy_all(copies: list[tuple[torch.Tensor, np.ndarray]]) -> None:
    for device_view, host_view in copies:
        device_view.copy_(torch.from_numpy(host_view), non_blocking=True)


def _to_host(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
    host.copy_(tensor)  # synchronous: the pages are handed to someone else right after
    return host
