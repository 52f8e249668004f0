"""VarlenInputs: a prefill or mixed step's inputs, staged from the streams into the fixed buffers.

A varlen step's rows are its decode rows (one token each, first) then its prefill chunks, laid
out row after row. Each row's tokens, positions, KV write locations, block-table row and state
slot are staged on the host, then uploaded.

Under `padded_prefill` the step is padded to the smallest prefill bucket that holds its tokens
(`PaddedBucket`: a token count and fixed row capacities), so its shapes and every kernel's grid
are the bucket's and it can be a captured graph:

- padding tokens (past the last row) write their K/V to the sink page and belong to a
  zero-length padding row (or the last row, past its end): no kernel reads them for a real row;
- padding rows are zero-length, on the sink page and the sink state slot;
- the GDN layers take the step split (model/step.GdnSplit): the decode rows step in place by
  slot (the decode kernel; padding entries on the sink do nothing), the prefill rows run as
  chunked sequences whose chunk table is built here on the host, with no device read.

Without it, the step runs eager on the prefill backend's kernels, planned on the host for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from resident.backends import PrefillStep, StepKernels
from resident.config import EngineConfig
from resident.engine.buffers import (
    HostStaging,
    SampledTokens,
    StepBuffers,
    copy_all,
    ids_from_sampled,
    sampled_sources,
)
from resident.engine.phases import PhaseTiming
from resident.engine.request import PENDING_TOKEN, Request
from resident.engine.scheduler import StepPlan
from resident.model.ops import ModelOps
from resident.model.step import GDN_CHUNK, GdnSplit, StepMeta, chunk_table
from resident.resources.kv import SINK_PAGE, KVPool
from resident.resources.positions import Positions
from resident.resources.recurrent import SINK_SLOT, StatePool


@dataclass(frozen=True)
class PaddedBucket:
    """A padded step's shape: its tokens, and room for decode rows and prefill rows. Each
    token size comes for prefill steps (no decode rows: nothing of a decode row runs, not even a
    skipped kernel) and for mixed steps with room for a sixteenth, a quarter and all of the
    decode rows a step of that size can hold: a padded decode row still runs the GDN and conv
    decode kernels, and those grow with the rows (the H200's GDN decode: 0.69 ms a step at 64
    rows), so a mixed step at c=64 should not pay for 256. Their graphs are cheap: the compiled
    dense parts see only the tokens, which the sizes share. Prefill rows: one per
    TOKENS_PER_ROW tokens, at most max_prefill_rows, so a small bucket's padding sequences stay
    few; the largest bucket holds max_prefill_rows, so every step the scheduler makes fits
    one."""

    index: int  # the bucket's place among the engine's buckets: its graph's key
    tokens: int
    decode_rows: int
    prefill_rows: int

    TOKENS_PER_ROW = 32

    @classmethod
    def all_of(cls, config: EngineConfig) -> list[PaddedBucket]:
        shapes, largest = [], max(config.prefill_buckets, default=0)
        for tokens in config.prefill_buckets:
            prefill = min(config.max_prefill_rows, max(1, tokens // cls.TOKENS_PER_ROW))
            if tokens == largest:  # any step the scheduler makes fits the largest
                prefill = config.max_prefill_rows
            most = min(config.max_decode_rows, tokens)
            ladder = sorted({most >> 4, most >> 2, most} - {0})
            shapes += [(tokens, 0, prefill), *((tokens, decode, prefill) for decode in ladder)]
        return [cls(index, *shape) for index, shape in enumerate(shapes)]

    def holds(self, num_tokens: int, decode: int, prefill: int) -> bool:
        return (num_tokens <= self.tokens and prefill <= self.prefill_rows
                and decode <= self.decode_rows and (decode > 0) == (self.decode_rows > 0))

    @property
    def rows(self) -> int:
        return self.decode_rows + self.prefill_rows

    @property
    def logits_rows(self) -> int:
        return min(self.rows, self.tokens)

    @property
    def chunks(self) -> int:
        """Most GDN chunks: the tokens' full chunks, and a partial one a sequence."""
        return self.tokens // GDN_CHUNK + self.prefill_rows + 2

    def describe(self) -> str:
        return (f"{self.tokens} tokens, {self.decode_rows} decode rows, {self.prefill_rows} "
                f"prefill rows, no host plan")


def write_locations(page_lists: list[list[int]], starts: list[int], page_size: int) -> list[int]:
    """Each stream's KV write location (page * page_size + offset) of its token at `start`."""
    return [pages[start // page_size] * page_size + start % page_size
            for pages, start in zip(page_lists, starts, strict=True)]


def stage_one_token_rows(arrays, requests: list[Request], kv: KVPool, states: StatePool,
                         positions: Positions, phases: PhaseTiming) -> list[list[int]]:
    """Rows of one token each (decode rows: a decode step's, a mixed step's leading ones) into
    `arrays`' positions, KV write locations and state slots, a list per array rather than row
    by row (64 rows: ~0.5 ms on the VM row by row); returns their page lists, for the block
    tables."""
    num_rows = len(requests)
    ids = [r.request_id for r in requests]
    starts = [r.num_computed for r in requests]
    phases.lap("rest")
    arrays.positions[:num_rows] = [positions.position(rid, start)
                                   for rid, start in zip(ids, starts, strict=True)]
    phases.lap("positions")
    page_lists = [kv.streams[rid].pages for rid in ids]
    arrays.kv_write_loc[:num_rows] = write_locations(page_lists, starts, kv.page_size)
    phases.lap("kv_plan")
    arrays.state_slots[:num_rows] = [states.slots[rid] for rid in ids]
    phases.lap("gdn_linear")
    return page_lists


def fill_tables(tables: np.ndarray, page_lists: list[list[int]]) -> int:
    """Block-table row i from page_lists[i] (columns past its pages left as they are); returns
    the width, the longest row's pages (at least 1)."""
    for row_index, pages in enumerate(page_lists):
        tables[row_index, :len(pages)] = pages
    return max(map(len, page_lists), default=1)


@dataclass(frozen=True)
class StagedVarlen:
    """A staged and uploaded varlen step."""

    num_tokens: int
    num_rows: int
    width: int  # block-table columns its rows use
    num_sampling: int  # rows that sample: the logits rows, in row order
    max_query_len: int
    bucket: PaddedBucket | None  # the bucket it was padded to (padded_prefill)


class VarlenInputs:
    def __init__(self, config: EngineConfig, buffers: StepBuffers, kv: KVPool,
                 states: StatePool, positions: Positions, kernels: StepKernels,
                 phases: PhaseTiming) -> None:
        self.page_size = config.page_size
        self.buffers, self.kernels, self.phases = buffers, kernels, phases
        self.kv, self.states, self.positions = kv, states, positions
        self.buckets = PaddedBucket.all_of(config)
        self.host: HostStaging | None = None  # the ring entry the last staged step wrote
        self._row_indices = np.arange(config.max_step_rows + 1)

    def bucket_for(self, num_tokens: int, decode: int, prefill: int) -> PaddedBucket | None:
        """The smallest padded bucket that holds a step of these tokens and rows; None when
        steps are not padded."""
        if not self.buckets:
            return None
        for bucket in self.buckets:
            if bucket.holds(num_tokens, decode, prefill):
                return bucket
        raise ValueError(f"a step of {num_tokens} tokens, {decode} decode and {prefill} prefill "
                         f"rows fits no prefill bucket (the largest: {self.buckets[-1]})")

    def stage(self, plan: StepPlan, sampled: SampledTokens | None = None) -> StagedVarlen:
        """Stages and uploads a prefill or mixed step's rows, padded to its bucket if steps
        are padded. A decode row whose last token the step before sampled and has not read
        back takes it from `sampled` on the device (the step launches before that read-back,
        engine.py); every other token comes from the host."""
        host = self.host = self.buffers.next_host()
        num_tokens, width, num_sampling, max_len = self._stage_rows(host, plan)
        sources = self._pending_sources(host, plan, sampled)
        # the decode rows' parts are lapped as a decode step's; a prompt row stages each of
        # its arrays in one loop, charged here
        self.phases.lap("kv_plan")
        num_rows, decode = len(plan.rows), plan.num_decode_rows
        bucket = self.bucket_for(num_tokens, decode, num_rows - decode)
        if bucket is None:
            self._upload(host, num_rows)
        else:
            self._pad(host, bucket, num_tokens, num_rows, num_sampling)
            self._stage_split(host, plan, bucket, num_tokens)
            self.phases.lap("declare_admit_pad")
            self._upload(host, bucket.rows)
        # decode row r is token r: its id lands over the placeholder the host uploaded
        ids_from_sampled(self.buffers.input_ids_gpu, sources, sampled, host.varlen_id_rows,
                         self.buffers.varlen_id_rows_gpu, self.buffers.id_values_gpu)
        self.phases.lap("kv_stage")
        return StagedVarlen(num_tokens, num_rows, width, num_sampling, max_len, bucket)

    @staticmethod
    def _pending_sources(host: HostStaging, plan: StepPlan,
                         sampled: SampledTokens | None) -> list[int]:
        """Each decode row's place in `sampled` (-1: its token is on the host); the pending
        ones' staged ids become 0 until the device copy replaces them."""
        rows = plan.rows[:plan.num_decode_rows]
        sources = sampled_sources(rows, sampled)
        ids = host.input_ids[:len(rows)]
        from_device = np.asarray(sources, dtype=np.int64) >= 0
        missing = ~from_device & (ids == PENDING_TOKEN)
        if missing.any():
            row = rows[int(missing.argmax())]
            raise RuntimeError(f"request {row.request.request_id}'s last token is not read back "
                               f"and was not sampled by the step before")
        ids[from_device] = 0
        return sources

    def _stage_rows(self, host: HostStaging, plan: StepPlan) -> tuple[int, int, int, int]:
        """Each row's arrays; returns (tokens, block-table width, sampling rows, longest row).
        The logits rows are the sampling rows in order."""
        decode = plan.num_decode_rows
        width = self._stage_decode_rows(host, [row.request for row in plan.rows[:decode]])
        num_tokens, num_sampling, max_len = decode, decode, 1
        for index, row in enumerate(plan.rows[decode:], start=decode):
            width = max(width, self._stage_row(host, index, num_tokens, row.num_new,
                                               row.request))
            num_tokens += row.num_new
            max_len = max(max_len, row.num_new)
            if row.samples:
                host.logits_indices[num_sampling] = num_tokens - 1
                num_sampling += 1
        return num_tokens, width, num_sampling, max_len

    def _stage_decode_rows(self, host: HostStaging, requests: list[Request]) -> int:
        """The leading decode rows (one token each, each its own logits row); returns their
        block-table width."""
        num_rows = len(requests)
        page_lists = stage_one_token_rows(host, requests, self.kv, self.states, self.positions,
                                          self.phases)
        host.input_ids[:num_rows] = [r.output_ids[-1] for r in requests]
        host.token_seq[:num_rows] = self._row_indices[:num_rows]
        host.logits_indices[:num_rows] = self._row_indices[:num_rows]
        host.query_start_loc[:num_rows + 1] = self._row_indices[:num_rows + 1]
        return fill_tables(host.block_tables, page_lists)

    def _stage_row(self, host: HostStaging, index: int, first: int, num_new: int,
                   request: Request) -> int:
        rid, end = request.request_id, first + num_new
        start = request.num_computed
        pages = np.asarray(self.kv.streams[rid].pages, dtype=np.int64)
        stream_index = np.arange(start, start + num_new)
        host.input_ids[first:end] = request.next_tokens(num_new)
        host.positions[first:end] = self.positions.position(rid, start) + np.arange(num_new)
        host.token_seq[first:end] = index
        host.kv_write_loc[first:end] = (pages[stream_index // self.page_size] * self.page_size
                                        + stream_index % self.page_size)
        host.block_tables[index, :len(pages)] = pages
        host.state_slots[index] = self.states.slots[rid]
        host.query_start_loc[index + 1] = end
        return len(pages)

    def _pad(self, host: HostStaging, bucket: PaddedBucket, num_tokens: int, num_rows: int,
             num_sampling: int) -> None:
        """Padding tokens after the last row's end, on the sink page and in the last row of
        the bucket; zero-length padding rows on the sink; logits rows past the sampling ones
        read token 0 (the caller drops them)."""
        tokens, rows = slice(num_tokens, bucket.tokens), slice(num_rows, bucket.rows)
        host.input_ids[tokens] = 0
        host.positions[tokens] = 0
        host.token_seq[tokens] = bucket.rows - 1
        host.kv_write_loc[tokens] = SINK_PAGE * self.page_size
        host.query_start_loc[num_rows + 1:bucket.rows + 1] = num_tokens
        host.state_slots[rows] = SINK_SLOT
        host.block_tables[rows, 0] = SINK_PAGE
        host.logits_indices[num_sampling:bucket.logits_rows] = 0

    def _stage_split(self, host: HostStaging, plan: StepPlan, bucket: PaddedBucket,
                     num_tokens: int) -> None:
        """The GDN split (model/step.GdnSplit): decode slots, the prefill rows as sequences
        after a first one of the decode tokens, and their chunk table."""
        decode, num_rows = plan.num_decode_rows, len(plan.rows)
        host.decode_slots[:decode] = host.state_slots[:decode]
        host.decode_slots[decode:bucket.decode_rows] = SINK_SLOT
        num_seqs = num_rows - decode + 1
        cu = host.gdn_cu_seqlens
        cu[0] = 0
        cu[1:num_seqs + 1] = host.query_start_loc[decode:num_rows + 1]
        cu[num_seqs + 1:bucket.prefill_rows + 2] = num_tokens  # zero-length: no chunks
        slots = host.gdn_slots
        slots[0] = SINK_SLOT
        slots[1:num_seqs] = host.state_slots[decode:num_rows]
        slots[num_seqs:bucket.prefill_rows + 1] = SINK_SLOT
        chunk_table(cu[:bucket.prefill_rows + 2],
                    host.gdn_chunks[:2 * bucket.chunks].reshape(-1, 2),
                    host.gdn_chunk_offsets[:bucket.prefill_rows + 2], GDN_CHUNK)

    def _upload(self, host: HostStaging, num_rows: int) -> None:
        """Two copies: every varlen array at once (one span of the flat arrays: a step's rows
        are a few KB of it, the span ~100 KB, which costs the GPU a few µs; a copy an array
        cost the host ~5 µs and the GPU a memcpy each, 12 a step), then the rows' whole
        block-table rows, one contiguous run (columns past a row's pages are never read)."""
        buf, span = self.buffers, self.buffers.varlen_span
        copy_all([(buf.flat_gpu[span], host.flat[span]),
                  (buf.block_tables_gpu[:num_rows], host.block_tables[:num_rows])])

    def ops(self, plan: StepPlan, staged: StagedVarlen, layout) -> ModelOps:
        """The step's ops: a padded step's are fixed; an eager step's are the prefill backend's,
        planned for it (attention, fla's varlen metadata) from `layout` if it needs one."""
        if staged.bucket is not None:
            return self.kernels.padded.ops()
        rows = staged.num_rows
        step = PrefillStep(self.host.query_start_loc[:rows + 1].copy(), layout)
        ops = self.kernels.prefill.ops(step)
        self.phases.lap("attention")
        return ops

    def meta(self, staged: StagedVarlen) -> StepMeta:
        if staged.bucket is not None:
            return self.padded_meta(staged.bucket, staged.max_query_len)
        return self._meta(staged.num_tokens, staged.num_rows, staged.width,
                          staged.num_sampling, staged.max_query_len)

    def padded_meta(self, bucket: PaddedBucket, max_query_len: int,
                    width: int | None = None) -> StepMeta:
        """A bucket's StepMeta over the fixed buffers. The block tables are full width (a row
        of any length reads its own pages) unless `width` bounds them; `max_query_len` is read
        only by the torch references."""
        buf = self.buffers
        width = width or buf.block_tables_gpu.shape[1]
        split = GdnSplit(buf.decode_slots_gpu[:bucket.decode_rows],
                         buf.gdn_cu_seqlens_gpu[:bucket.prefill_rows + 2],
                         buf.gdn_slots_gpu[:bucket.prefill_rows + 1],
                         buf.gdn_chunks_gpu[:2 * bucket.chunks].view(-1, 2),
                         buf.gdn_chunk_offsets_gpu[:bucket.prefill_rows + 2], GDN_CHUNK)
        return self._meta(bucket.tokens, bucket.rows, width, bucket.logits_rows, max_query_len,
                          split)

    def _meta(self, num_tokens: int, num_rows: int, width: int, num_logits: int,
              max_query_len: int, split: GdnSplit | None = None) -> StepMeta:
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
            gdn_split=split,
        )

    def stage_idle(self, bucket: PaddedBucket) -> None:
        """An all-padding step of the bucket, for its graph's capture."""
        host = self.host = self.buffers.next_host()
        host.query_start_loc[0] = 0
        self._pad(host, bucket, 0, 0, 0)
        self._stage_split(host, StepPlan([], "prefill", []), bucket, 0)
        self._upload(host, bucket.rows)
