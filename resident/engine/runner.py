"""StepRunner: the host-planned step. Fills fixed-address buffers from the host streams, runs the
forward, and moves requests' device state in and out of host memory.

Every step rebuilds each row's tokens, positions, block-table row, KV write locations and state
slot into host staging arrays (numpy views of pinned memory on CUDA), then copies what the step
uses into device buffers that never move, so a captured graph can read them. A decode-only step
pads to the smallest decode bucket that holds it; padding rows point at the sink page and slot.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import torch

from resident.config import EngineConfig
from resident.engine.request import Request
from resident.engine.scheduler import StepPlan
from resident.kernels.resident import advance_lengths_ref, gather_rows_ref, scatter_cells_ref
from resident.model.cache import ModelCache
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


class StepBuffers:
    """Fixed-address device buffers a step reads, and their host staging twins."""

    def __init__(self, max_tokens: int, max_rows: int, max_pages: int, device: torch.device):
        pin = device.type == "cuda"

        def pair(*shape: int, dtype=torch.int64) -> tuple[torch.Tensor, np.ndarray]:
            host = torch.zeros(shape, dtype=dtype, pin_memory=pin)
            return torch.zeros(shape, dtype=dtype, device=device), host.numpy()

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
                 kv: KVPool, states: StatePool, positions: Positions) -> None:
        self.model, self.cache, self.config = model, cache, config
        self.kv, self.states, self.positions = kv, states, positions
        self.device = cache.kv.device
        self.page_size = config.page_size
        max_rows = max(config.max_num_seqs, config.max_decode_rows)
        max_tokens = config.prefill_token_budget + config.max_decode_rows
        max_pages = -(-config.max_model_len // config.page_size)
        self.buffers = StepBuffers(max_tokens, max_rows, max_pages, self.device)
        # a resident decode step's rows are 0..b-1, one token each: token rows, query starts
        # and logits rows are all this range, fixed for the step's bucket
        self.arange_gpu = torch.arange(max_rows + 1, device=self.device)
        self._host_copies: dict[str, HostCopy] = {}

    # -- planning ---------------------------------------------------------------------------

    def bucket_for(self, num_rows: int) -> int:
        buckets = self.config.decode_buckets
        return buckets[bisect.bisect_left(buckets, num_rows)]

    def prepare(self, plan: StepPlan) -> tuple[torch.Tensor, StepMeta]:
        """Stages the plan into the buffers. Returns input ids and the step's metadata; the
        logits rows are the sampling rows in step order (then a decode step's padding)."""
        buf = self.buffers
        num_rows = len(plan.rows)
        padded_rows = self.bucket_for(num_rows) if plan.kind == "decode" else num_rows
        token, width, num_sampling = 0, 1, 0
        buf.query_start_loc_cpu[0] = 0
        for row_index, row in enumerate(plan.rows):
            request = row.request
            width = max(width, self._stage_row(row_index, token, row.num_new, request))
            token += row.num_new
            if row.samples:
                buf.logits_indices_cpu[num_sampling] = token - 1
                num_sampling += 1
        for row_index in range(num_rows, padded_rows):
            self._stage_padding_row(row_index, token)
            buf.logits_indices_cpu[row_index] = token
            token += 1
        num_logits = padded_rows if plan.kind == "decode" else num_sampling
        meta = self._upload(token, padded_rows, width, num_logits, plan.kind)
        return buf.input_ids_gpu[:token], meta

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

    def _stage_padding_row(self, row_index: int, token: int) -> None:
        buf = self.buffers
        buf.input_ids_cpu[token] = 0
        buf.positions_cpu[token] = 0
        buf.token_seq_cpu[token] = row_index
        buf.kv_write_loc_cpu[token] = SINK_PAGE * self.page_size
        buf.block_tables_cpu[row_index, 0] = SINK_PAGE
        buf.state_slots_cpu[row_index] = SINK_SLOT
        buf.query_start_loc_cpu[row_index + 1] = token + 1

    def _upload(self, num_tokens: int, num_rows: int, width: int, num_logits: int,
                kind: str) -> StepMeta:
        buf = self.buffers
        copies = [
            (buf.input_ids_gpu[:num_tokens], buf.input_ids_cpu[:num_tokens]),
            (buf.positions_gpu[:num_tokens], buf.positions_cpu[:num_tokens]),
            (buf.token_seq_gpu[:num_tokens], buf.token_seq_cpu[:num_tokens]),
            (buf.kv_write_loc_gpu[:num_tokens], buf.kv_write_loc_cpu[:num_tokens]),
            (buf.query_start_loc_gpu[:num_rows + 1], buf.query_start_loc_cpu[:num_rows + 1]),
            (buf.state_slots_gpu[:num_rows], buf.state_slots_cpu[:num_rows]),
            (buf.logits_indices_gpu[:num_logits], buf.logits_indices_cpu[:num_logits]),
            (buf.block_tables_gpu[:num_rows, :width], buf.block_tables_cpu[:num_rows, :width]),
        ]
        for device_view, host_view in copies:
            device_view.copy_(torch.from_numpy(host_view), non_blocking=True)
        max_query_len = 1 if kind == "decode" else int(
            np.diff(buf.query_start_loc_cpu[:num_rows + 1]).max())
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

    # -- the resident decode step -----------------------------------------------------------

    def execute_resident(self, plan: StepPlan, planner: ResidentPlanner,
                         staged: StagedStep) -> tuple[torch.Tensor, StepMeta]:
        """The eager replay of a captured resident decode step over the same fixed buffers:
        scatter staged cells, gather the rows by slot, run, advance the stored lengths."""
        buf, layout = self.buffers, planner.layout
        bucket = staged.slot_ids_gpu.shape[0]
        num_rows = len(plan.rows)
        buf.input_ids_cpu[:num_rows] = [row.request.output_ids[-1] for row in plan.rows]
        buf.input_ids_cpu[num_rows:bucket] = 0
        buf.input_ids_gpu[:bucket].copy_(torch.from_numpy(buf.input_ids_cpu[:bucket]),
                                         non_blocking=True)
        pool = layout.pool(layout.position_pool)
        scatter_cells_ref(planner.store_gpu, staged.cells_gpu)
        gather_rows_ref(
            planner.store_gpu, staged.slot_ids_gpu, pool.length_col, layout.offset_col,
            layout.state_col, pool.span_start, staged.width, self.page_size,
            buf.block_tables_gpu[:bucket, :staged.width], buf.positions_gpu[:bucket],
            buf.kv_write_loc_gpu[:bucket], buf.state_slots_gpu[:bucket],
        )
        meta = StepMeta(
            positions=buf.positions_gpu[:bucket],
            token_seq=self.arange_gpu[:bucket],
            query_start_loc=self.arange_gpu[:bucket + 1],
            block_tables=buf.block_tables_gpu[:bucket, :staged.width],
            kv_write_loc=buf.kv_write_loc_gpu[:bucket],
            state_slots=buf.state_slots_gpu[:bucket],
            logits_indices=self.arange_gpu[:bucket],
            max_query_len=1,
        )
        logits = self.execute(buf.input_ids_gpu[:bucket], meta)
        advance_lengths_ref(planner.store_gpu, staged.slot_ids_gpu,
                            [p.length_col for p in layout.pools if p.appends])
        return logits, meta

    # -- execution --------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, input_ids: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        """[num_logits, vocab] logits of the step's sampling rows (then padding rows)."""
        hidden = self.model(input_ids, meta, self.cache)
        return self.model.compute_logits(hidden[meta.logits_indices])

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


def _to_host(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pin)
    host.copy_(tensor)  # synchronous: the pages are handed to someone else right after
    return host
