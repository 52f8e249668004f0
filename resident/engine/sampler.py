"""Sampler: a step's tokens from its logits, all rows in one batched draw on the device
(draw.py): greedy at temperature 0, otherwise temperature, top-k, top-p and min-p, with noise
keyed by the request's seed (its own, or one the sampler gives it from the engine's seed) and
the token's index in its output, so a seed gives the same tokens whatever else is in the step.
Rows whose request asked for logprobs also get the sampled token's log-probability and the top
k, from the raw logits' log-softmax, read back with the tokens; a step where no row asked
computes and copies nothing more. A step with no sampled row (all greedy) draws nothing: its
tokens are the argmax, a decode graph's own (`StepLogits.greedy`).

The draw's per-row parameters sit at fixed addresses (sampling_state.py). A decode step under
resident planning gathers them by slot from `SamplingSlots` (written only for rows the planner
writes whole) and advances each row's token index on the device; any other step uploads its
rows' parameters. A decode step's parameters are staged before its forward (`stage_rows`,
`stage_by_slot`) and its draw (`draw_decode`: take by slot, then draw) runs after the forward
inside the same graph: the runner captures each decode bucket twice, greedy and drawing
(runner.py), and a step that draws replays the drawing one, so sampling costs a decode step no
launch of its own. A varlen (prefill or mixed) step is drawn after its forward: its rows'
logits are copied into the runner's fixed logits buffer and drawn by a graph captured over it,
at the smallest decode bucket (or the step's most rows) that holds them; launched eagerly from
Python the race's eight kernels cost a mixed step ~1 ms of host time.

A row whose logits are not finite after its temperature (NaN logits; a temperature that
overflows float32, 1e-40) keeps its greedy token and is flagged on the device; its request
fails alone when the flags are read back with the tokens (TokenReadback.failed)."""

from __future__ import annotations

import bisect
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from resident.backends.base import torch_argmax
from resident.engine.draw import Drawn, draw, vocab_counters
from resident.engine.graphs import StepGraphs
from resident.engine.sampling_state import (
    HostColumns,
    ParamColumns,
    RowColumns,
    SamplingSlots,
    seed_bits,
)
from resident.engine.types import SamplingParams
from resident.kernels import compute_dtype

log = logging.getLogger("resident.engine")

FAILED_DRAW = "sampling failed: the logits are not finite at this temperature"


class StepLogits(NamedTuple):
    """What a step's forward gives the sampler: [rows, vocab] logits and, from a decode
    bucket's graph, each row's argmax computed inside it ([rows] int64; None for other steps):
    greedy rows then cost the host no launch; and from a decode step that draws, every row of
    its bucket drawn after the forward (`Sampler.draw_decode`), else None."""

    logits: torch.Tensor
    greedy: torch.Tensor | None = None
    drawn: Drawn | None = None
    # the TokenRing publish that holds this step's tokens (greedy's, or drawn's where drawn is
    # set), when its launch published them; None: read them back by a copy
    published: int | None = None


def ring_bytes(step: StepLogits) -> torch.Tensor:
    """What a decode launch publishes into the token ring (engine/token_ring.py): its greedy
    tokens, or, for a drawing step, its draw in draw.packed_drawn's layout (tokens, then a
    failure byte a row; packed here where the sampler drew them apart)."""
    drawn = step.drawn
    if drawn is None:
        return step.greedy
    if drawn.packed is not None:
        return drawn.packed
    return torch.cat((drawn.tokens.view(torch.uint8), drawn.failed.view(torch.uint8)))


class SampleRow(NamedTuple):
    """One sampling row of a step: its request, and the index its token takes in the
    request's output (the draw's counter)."""

    request_id: str
    params: SamplingParams
    index: int


@dataclass(frozen=True)
class StepLogprobs:
    """The logprobs a step's rows asked for, still on the device."""

    rows: tuple[int, ...]  # the asking rows' indices among the step's sampling rows
    counts: tuple[int, ...]  # how many top logprobs each asked
    values: torch.Tensor  # [len(rows), 1 + max(counts)] float64: the sampled token's, the top
    ids: torch.Tensor  # [len(rows), max(counts)] int64: the top tokens, most likely first


class Sampler:
    def __init__(self, device: torch.device, seed: int, vocab_size: int, max_rows: int,
                 name: str = "torch", slots: SamplingSlots | None = None,
                 argmax: Callable[[torch.Tensor], torch.Tensor] = torch_argmax,
                 pdl: bool = False) -> None:
        """name: the draw's filter (draw.SAMPLERS); slots: the resident planner's sampling
        slots, or None when decode steps are host-planned; max_rows: the most rows a step
        samples; argmax: the greedy tokens of a step whose forward gave none (StepKernels');
        pdl: the `triton` race's kernels launched with PDL (the `pdl` knob's answer)."""
        self.device, self.name, self.slots, self.argmax = device, name, slots, argmax
        self.pdl = pdl
        self.fused = device.type == "cuda"  # the race on its Triton kernel (draw.py)
        self._seeds = random.Random(seed)
        # each added request's columns but its token index: a step's rows are then looked up,
        # not built (the host-planned arm stages every row of every step)
        self._constants: dict[str, _RowConstants] = {}
        # the requests added and not dropped that sample (temperature > 0) / ask for logprobs:
        # a step under resident slots then needs no pass over its rows to know
        self._sampling: set[str] = set()
        self._asking: set[str] = set()
        self._counters_gpu = vocab_counters(vocab_size, device)  # [vocab]
        self._columns = ParamColumns(max_rows, device)
        # pinned staging, one for decode steps and one for varlen steps: a decode step
        # launched ahead stages while the varlen step before it may not have copied its own
        # rows yet (a staging is rewritten only after the read-back that follows its copy)
        self._decode_staging = HostColumns(max_rows, device)
        self._varlen_staging = HostColumns(max_rows, device)
        self._varlen_graphs = _DrawGraphs(f"{name} varlen draw") \
            if device.type == "cuda" else None
        # [max_rows, vocab]: where a varlen step's rows' logits are copied for its draw graphs
        self._varlen_logits_gpu: torch.Tensor | None = None
        self._meeting = _kept_zeros() if name == "triton" else None  # the race's counters

    def add(self, request_id: str, params: SamplingParams) -> None:
        seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
        self._constants[request_id] = _RowConstants.of(params, seed)
        if params.temperature > 0:
            self._sampling.add(request_id)
        if params.logprobs is not None:
            self._asking.add(request_id)

    def drop(self, request_id: str) -> None:
        self._constants.pop(request_id, None)
        self._sampling.discard(request_id)
        self._asking.discard(request_id)

    @property
    def any_logprobs(self) -> bool:
        """Whether a request added and not dropped asks for logprobs."""
        return bool(self._asking)

    def by_slot(self, decode_bucket: int) -> bool:
        """Whether a step of this decode bucket (0: not a decode step) draws by resident slot
        (`stage_by_slot`), with no rows from the host."""
        return self.slots is not None and decode_bucket > 0

    def columns(self, rows: list[SampleRow]) -> RowColumns:
        """The rows in ParamColumns' layout (a request never added draws with seed 0)."""
        constants = [self._constants.get(row.request_id) or _RowConstants.of(row.params, 0)
                     for row in rows]
        return RowColumns([c.floats for c in constants],
                          [(c.top_k, c.seed, row.index)
                           for c, row in zip(constants, rows, strict=True)])

    # -- decode steps: staged before the forward, drawn inside its graph ----------------------

    def stage_rows(self, rows: list[SampleRow]) -> bool:
        """A host-planned decode step (not `by_slot`): uploads its rows' parameters, row i's
        for rows[i], before its forward, whose graph draws from them (`draw_decode`). Whether
        any row samples; when none does nothing is uploaded and the step takes its greedy
        tokens."""
        return self._upload(rows, self._decode_staging)

    def stage_by_slot(self, whole: list[tuple[int, SampleRow]]) -> bool:
        """A decode step under resident slots (`by_slot`): writes `whole` (slot, row) into
        their slots before its forward (even in a greedy step: a later draw gathers these
        slots). No pass over the rows: the bucket draws whenever an added request samples,
        whether or not it is in this step (its greedy rows then draw their greedy tokens, at
        the cost of the draw's GPU time). Whether the step draws."""
        if whole:
            self.slots.write([slot for slot, _ in whole], self.columns([row for _, row in whole]))
        return bool(self._sampling)

    def draw_decode(self, step: StepLogits, bucket: int) -> Drawn:
        """A decode bucket's draw over all its rows, staged by `stage_rows` or
        `stage_by_slot`: by slot under resident slots (its rows' parameters taken, their
        indices advanced, then the draw), else from the uploaded columns. Device ops only: the
        runner captures it in the bucket's drawing graph, after the forward."""
        if self.slots is not None:
            self.slots.take(self._columns, bucket)
        return self._draw(step, bucket)

    # -- varlen (prefill and mixed) steps: drawn after the forward ----------------------------

    def sample(self, step: StepLogits, rows: list[SampleRow]) -> Drawn | None:
        """A varlen step's draw. step.logits: [>= len(rows), vocab], row i's for rows[i].
        Returns the [len(rows)] tokens and failures on the logits' device, not yet read back
        (the caller's one host sync per step); None when no row samples (the tokens are the
        greedy ones, `greedy`)."""
        if not self._upload(rows, self._varlen_staging):
            return None
        num_rows = len(rows)
        bucket = self._varlen_graphs.fitting(num_rows) if self._varlen_graphs else None
        if bucket is None:
            return self._draw(step, num_rows).first(num_rows)
        self._varlen_logits_gpu[:num_rows].copy_(step.logits[:num_rows])
        return self._varlen_graphs.replay_first(bucket, num_rows)

    def capture(self, buckets: tuple[int, ...], logits_gpu: torch.Tensor) -> None:
        """One draw graph per varlen bucket (the decode buckets below logits_gpu's rows, and
        its rows) over logits_gpu ([max rows, vocab], the runner's decode logits: a varlen
        step's are copied there). The uploaded columns' padding rows are drawn too, and
        ignored. A capture that fails (a filter that syncs or reads back) is logged and those
        draws run eagerly: sampled steps get slower, the server still starts."""
        if self._varlen_graphs is None:
            return
        max_rows = logits_gpu.shape[0]
        varlen_buckets = tuple(sorted({b for b in buckets if b < max_rows} | {max_rows}))
        if not self._varlen_graphs.capture(varlen_buckets, lambda bucket: self._draw(
                StepLogits(logits_gpu[:bucket]), bucket)):
            self._varlen_graphs = None
            return
        self._varlen_logits_gpu = logits_gpu

    def greedy(self, step: StepLogits, num_rows: int) -> torch.Tensor:
        """[num_rows] argmax tokens: the decode graph's own, or computed now."""
        greedy = step.greedy
        if greedy is not None:
            return greedy if greedy.shape[0] == num_rows else greedy[:num_rows]
        return self.argmax(step.logits[:num_rows])

    def _upload(self, rows: list[SampleRow], staging: HostColumns) -> bool:
        """Uploads the rows' parameters through `staging` when one of them samples; whether
        one does (none: nothing is uploaded, the rows take their greedy tokens)."""
        if not any(row.params.temperature > 0 for row in rows):
            return False
        staging.put(self.columns(rows))
        staging.upload(self._columns, len(rows))
        return True

    def _draw(self, step: StepLogits, num_rows: int) -> Drawn:
        return draw(step.logits[:num_rows], self._columns.params(num_rows),
                    self.greedy(step, num_rows), self._counters_gpu, self.name, self.fused,
                    self._meeting, self.pdl)

    @staticmethod
    def logprobs(logits: torch.Tensor, tokens: torch.Tensor,
                 rows: list[SampleRow]) -> StepLogprobs | None:
        """The log-probabilities of the rows that asked for them (None when none did): each
        row's sampled token's and its top k, on the device, not yet read back."""
        asked = [index for index, row in enumerate(rows) if row.params.logprobs is not None]
        if not asked:
            return None
        counts = tuple(rows[index].params.logprobs for index in asked)
        # a list index is copied to the device; when every row asked, a slice needs no copy
        select = slice(0, len(rows)) if len(asked) == len(rows) else asked
        # fp32 at least: bf16 logits would round the log-softmax to 2-3 digits
        logprobs = torch.log_softmax(logits[select].to(compute_dtype(logits.dtype)), dim=-1)
        top_values, top_ids = logprobs.topk(max(counts), dim=-1)
        sampled = logprobs.gather(1, tokens[select][:, None])
        values = torch.cat([sampled, top_values], dim=1).to(torch.float64)
        return StepLogprobs(tuple(asked), counts, values, top_ids)


class _RowConstants(NamedTuple):
    """What a request's row of ParamColumns holds whatever its token index."""

    floats: tuple[float, float, float]  # temperature, top_p, min_p
    top_k: int
    seed: int  # as int64 bits

    @classmethod
    def of(cls, params: SamplingParams, seed: int) -> _RowConstants:
        return cls((params.temperature, params.top_p, params.min_p), params.top_k,
                   seed_bits(seed))


class _DrawGraphs:
    """A StepGraphs of draws: the buckets captured, and each (bucket, rows)'s views of a
    replay's outputs, made once (fixed addresses)."""

    def __init__(self, kind: str) -> None:
        self._graphs = StepGraphs(kind)
        self._views: dict[tuple[int, int], Drawn] = {}
        self._buckets: list[int] = []

    def capture(self, buckets: tuple[int, ...], draw_bucket: Callable[[int], Drawn]) -> bool:
        """Captures draw_bucket(b) for each bucket; False (logged) when a capture fails."""
        try:
            self._graphs.capture(buckets, lambda bucket: None, draw_bucket,
                                 lambda bucket: f"the draw of {bucket} rows")
        except Exception:  # noqa: BLE001 - a draw that cannot be held in a graph still draws
            log.exception("the %s could not be captured: those draws run eagerly",
                          self._graphs.kind)
            return False
        self._buckets = self._graphs.buckets
        return True

    def fitting(self, num_rows: int) -> int | None:
        """The smallest captured bucket of at least num_rows rows, or None."""
        index = bisect.bisect_left(self._buckets, num_rows)
        return self._buckets[index] if index < len(self._buckets) else None

    def replay_first(self, bucket: int, num_rows: int) -> Drawn:
        drawn = self._graphs.replay(bucket)
        views = self._views.get((bucket, num_rows))
        if views is None:
            views = self._views[(bucket, num_rows)] = drawn.first(num_rows)
        return views


def _kept_zeros():
    """A KeptZeros, imported at the sampler's build: triton must not load before
    TRITON_INTERPRET is set, which a module import here could precede."""
    from resident.kernels.gdc import KeptZeros

    return KeptZeros()
