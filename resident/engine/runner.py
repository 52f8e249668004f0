"""StepRunner: a step's forward over the fixed buffers, and the CUDA graphs that replay it.

The runner reads only what StepInputs (inputs.py, varlen.py) staged and uploaded. A decode
bucket's forward runs between its planning's device ops (planning.py: the resident ops, or
nothing when host-planned); a padded prefill or mixed step's on the padded ops
(backends/padded.py); an eager varlen step's on the prefill backend's ops planned for it. With
`cuda_graphs` on, each decode bucket and each prefill bucket is captured (graphs.py) and a step
is its graph's replay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from resident.backends import StepKernels
from resident.engine.buffers import DecodeInputs
from resident.engine.draw import Drawn
from resident.engine.graphs import StepGraphs
from resident.engine.inputs import StepInputs
from resident.engine.phases import PhaseTiming
from resident.engine.planning import StepPlanning
from resident.engine.sampler import StepLogits, ring_bytes
from resident.engine.scheduler import StepPlan
from resident.engine.token_ring import TokenRing
from resident.engine.varlen import PaddedBucket, StagedVarlen
from resident.model.cache import ModelCache
from resident.model.ops import ModelOps
from resident.model.qwen3_5 import Qwen3_5ForCausalLM
from resident.model.step import StepMeta

log = logging.getLogger("resident.graphs")


class StepRunner:
    def __init__(self, model: Qwen3_5ForCausalLM, cache: ModelCache, inputs: StepInputs,
                 planning: StepPlanning, kernels: StepKernels, phases: PhaseTiming,
                 cuda_graphs: bool, draw: Callable[[StepLogits, int], Drawn],
                 max_step_rows: int, ring: TokenRing | None = None) -> None:
        """draw(step, bucket): a decode bucket's draw after its forward (the sampler's
        `draw_decode`), captured in the bucket's drawing graph; max_step_rows: the logits
        buffer's rows (a varlen step's are drawn there too under graphs: Sampler.capture);
        ring: where each decode launch publishes its tokens (None: they are copied back)."""
        self.model, self.cache = model, cache
        self.ring = ring
        self.inputs, self.planning, self.kernels, self.phases = inputs, planning, kernels, phases
        self.draw = draw
        self.graphs = StepGraphs("decode") if cuda_graphs else None
        self.drawing_graphs = StepGraphs("decode and draw") if cuda_graphs else None
        self.prefill_graphs = StepGraphs("prefill") if cuda_graphs else None
        self.num_padded_prefills = 0
        # [max_step_rows, vocab]: every decode step's logits, at one fixed address (captured,
        # each bucket's own held 0.5 GiB in all at 0.8B, for each of the two graphs of a
        # bucket); zeros, not empty: a varlen draw graph reads its padding rows
        weight = model.output_weight()
        self.logits_gpu = torch.zeros(max_step_rows, model.config.vocab_size,
                                      dtype=weight.dtype, device=weight.device)

    def plan_varlen(self, plan: StepPlan, staged: StagedVarlen) -> Callable[[], StepLogits]:
        """A staged varlen step's host work, done now (an eager step's prefill backend plans
        for it, which may queue copies from its own host buffers); returns the launch of its
        forward, which gives [sampling rows, vocab] logits."""
        if staged.bucket is not None:
            self.num_padded_prefills += 1
            return lambda: StepLogits(self._timed(self.run_padded, staged.bucket,
                                                  staged.max_query_len)[:staged.num_sampling])
        varlen, layout = self.inputs.varlen, None
        if self.kernels.prefill.needs_layout:
            layout = self.inputs.host_layout(plan, staged.num_rows, staged.width,
                                             varlen.host.block_tables)
        ops = varlen.ops(plan, staged, layout)
        meta = varlen.meta(staged)
        self.phases.lap("rest")
        ids = self.inputs.buffers.input_ids_gpu[:staged.num_tokens]
        return lambda: StepLogits(self._timed(self.execute, ids, meta, ops))

    def launch_decode(self, bucket: int, width: int, draw: bool) -> StepLogits:
        """A decode bucket's step whose inputs (and host attention plan, if any) are in
        place, and whose draw is staged when `draw`: its drawing graph's replay (the forward,
        then `draw`), or `forward_decode` and the draw after it. (A replaced
        `forward_decode`, as the synthetic core's, serves a drawing step only where no
        drawing graph is captured: on CPU.)"""
        if draw and self.drawing_graphs is not None and self.drawing_graphs.has(bucket):
            return self.timed_decode(self.drawing_graphs.replay, bucket)
        step = self.forward_decode(bucket, width)
        if not draw:
            return step
        # drawn after the launch, not published: its tokens are copied back
        step = self._with_draw(step, bucket)._replace(published=None)
        self.phases.lap("sampler")
        return step

    def forward_decode(self, bucket: int, width: int) -> StepLogits:
        """[bucket, vocab] logits and their argmax of a decode bucket whose inputs (and host
        attention plan, if any) are in place: its graph's replay, or the eager forward."""
        if self.graphs is not None and self.graphs.has(bucket):
            return self.timed_decode(self.graphs.replay, bucket)
        return self.timed_decode(self._decode_forward, bucket, width)

    def timed_decode(self, forward, *args) -> StepLogits:
        """A decode launch, which publishes once (`_decode_forward`, `_draw_and_publish`, or
        bench_host's replay through `publish`): its number in the ring, counted as the launch
        is."""
        step = forward(*args)
        if self.ring is not None:
            step = step._replace(published=self.ring.launched())
        self.phases.lap("launch")
        return step

    def _with_draw(self, step: StepLogits, bucket: int) -> StepLogits:
        return step._replace(drawn=self.draw(step, bucket))

    def _draw_and_publish(self, step: StepLogits, bucket: int) -> StepLogits:
        """A drawing graph's draw after its forward, then its tokens and failures published."""
        return self.publish(self._with_draw(step, bucket))

    def publish(self, step: StepLogits) -> StepLogits:
        """A device op, last in the launch: the step's tokens into the ring (ring_bytes)."""
        if self.ring is not None:
            self.ring.publish(ring_bytes(step))
        return step

    def run_padded(self, bucket: PaddedBucket, max_query_len: int) -> torch.Tensor:
        """A staged padded step: its bucket's graph's replay, or the eager forward;
        [bucket.logits_rows, vocab]."""
        graphs = self.prefill_graphs
        if graphs is not None and graphs.has(bucket.index):
            return graphs.replay(bucket.index)
        return self.execute(self.inputs.buffers.input_ids_gpu[:bucket.tokens],
                            self.inputs.varlen.padded_meta(bucket, max_query_len),
                            self.kernels.padded)

    def _capture_drawing(self, decode_buckets: tuple[int, ...], prepare: Callable[[int], None],
                         width: int, describe: Callable[[int], str]) -> None:
        """Each decode bucket again with the draw after its forward, in the greedy graphs'
        pool (one of the two graphs of a bucket runs at a time, and its outputs are used
        before the next step's graph replays). A capture that fails (a filter that syncs or
        reads back) is logged, and drawing steps replay the greedy graph and draw eagerly:
        slower, but the server starts."""
        try:
            self.drawing_graphs.capture(
                decode_buckets, prepare,
                lambda bucket: self._draw_and_publish(
                    self._decode_forward(bucket, width, publish=False), bucket),
                describe, pool=self.graphs.pool)
        except Exception:  # noqa: BLE001 - a draw that cannot be held in a graph still draws
            log.exception("the decode steps' draw could not be captured: drawing steps draw "
                          "eagerly after the forward's graph")
            self.drawing_graphs = None

    @torch.inference_mode()
    def execute(self, input_ids: torch.Tensor, meta: StepMeta, ops: ModelOps) -> torch.Tensor:
        """[num_logits, vocab] logits of a varlen step's sampling rows."""
        hidden = self.model(input_ids, meta, self.cache, ops)
        return self.model.compute_logits(hidden[meta.logits_indices])

    def _timed(self, forward, *args):
        output = forward(*args)
        self.phases.lap("launch")
        return output

    def _decode_forward(self, bucket: int, width: int, publish: bool = True) -> StepLogits:
        """The bucket's forward between its planning's device ops, then each row's argmax
        (inside the graph), published in the ring unless a draw follows (`publish`)."""
        self.planning.before_forward(bucket, width)
        meta = self.inputs.decode_meta(bucket, width)
        with torch.inference_mode():
            input_ids = DecodeInputs.input_ids_of(self.inputs.buffers.decode_gpu, bucket)
            hidden = self.model(input_ids, meta, self.cache, self.kernels.decode.ops(bucket))
            logits = self.model.compute_logits(hidden, self.logits_gpu[:bucket])
            greedy = self.kernels.argmax(logits)
        self.planning.after_forward(bucket)
        step = StepLogits(logits, greedy)
        return self.publish(step) if publish else step

    def prepare_all(self, decode_buckets: tuple[int, ...],
                    lap: Callable[[str], None] = lambda name: None) -> None:
        """Every decode bucket (largest first) then every padded prefill bucket, staged all
        padding and run once: under `cuda_graphs` each is then captured (graphs.py), else this
        is the warm-up that compiles and tunes every step shape before the first request.
        `lap(name)` ends each half's start-up span (startup.py).
        Warming matters beyond start-up time: an engine whose compiled dense ops first meet
        the shapes in its requests' order gave other greedy tokens (1 of 24 prompts on the
        H200) than one warmed this way, and every later engine in the process."""
        decode, inputs, planning = self.kernels.decode, self.inputs, self.planning
        empty = StepPlan([], "decode", [])

        def prepare(bucket: int) -> None:
            inputs.stage_decode(empty, bucket)
            inputs.upload_decode(bucket)
            inputs.plan_attention(empty, bucket, 1)
            planning.stage_idle(bucket)

        def describe(bucket: int) -> str:
            free = "no" if decode.host_plan else "yes"
            return f"planning {planning.mode}, host_plan_free {free} ({decode.name})"

        # full width: a replay serves rows of any length
        width = planning.capture_width(inputs.max_pages)
        buckets = inputs.varlen.buckets
        if self.graphs is None:
            for bucket in sorted(decode_buckets, reverse=True):
                prepare(bucket)
                self._decode_forward(bucket, width)
            lap("decode warm-up")
            for bucket in buckets:
                inputs.varlen.stage_idle(bucket)
                self.run_padded(bucket, 1)
            lap("prefill warm-up")
            self._reset_ring()
            return
        self.graphs.capture(decode_buckets, prepare,
                            lambda bucket: self._decode_forward(bucket, width), describe)
        lap("decode graphs")
        self._capture_drawing(decode_buckets, prepare, width, describe)
        lap("decode graphs with the draw")
        self.prefill_graphs.capture(tuple(range(len(buckets))),
                                    lambda index: inputs.varlen.stage_idle(buckets[index]),
                                    lambda index: self.run_padded(buckets[index], 1),
                                    lambda index: buckets[index].describe())
        lap("prefill graphs")
        self._reset_ring()

    def _reset_ring(self) -> None:
        """The warm-ups published uncounted: both counts start from zero here."""
        if self.ring is not None:
            self.ring.reset()
