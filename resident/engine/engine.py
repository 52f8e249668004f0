"""Engine: the model, its caches and pools, the scheduler, the step's inputs, its planning, the
runner and the sampler, stepped by the engine-core process (server/core.py) or in process.

A step launches its forward, samples on the device and queues the tokens' copy to the host,
commits what needs no token value (the streams advance; each sampling row takes a pending token,
so max_tokens is decided), then waits for the tokens, the step's one wait for the GPU, and
emits. `plan_ahead` overlaps the next step with this one:

- `on`: between the commit and the wait, the next step is scheduled and prepared (a decode
  step's staging, planning.py), while the GPU runs this one; it launches once this step's
  tokens are emitted, before the engine core sends them and takes in new requests.
- `launch`: the next step also launches before the wait, decode or varlen (a varlen step is
  staged then), the token ids of rows this step sampled gathered on the device from its sampled
  tokens (buffers.SampledTokens), so the GPU goes from one step to the next without waiting for
  the host: a burst of prompts no longer idles the GPU while each step is staged. With
  `late_launch` the step after a decode step is scheduled and launched late in that step's GPU
  time instead, the engine core's intake (`Engine.intake`) polled until then, so a request
  arriving meanwhile joins it (launch_window.py).

Host staging is reused safely because every launch moves the read-back's event past its uploads
(TokenReadback.mark): the wait that returns a step's tokens also frees the host sources of every
upload queued before it, and a step that samples no row waits on that event all the same. A request
that max_tokens finishes is released at the commit, before the next step is scheduled, so planned
ahead or not the same requests join the same steps. One that finishes on a stop token (or is
aborted) while its row is in the next step, planned or launched, is released after that step, which
runs its row unsampled (`rows_after_finish`)."""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from resident.backends import build_kernels
from resident.config import EngineConfig
from resident.engine.buffers import SampledTokens
from resident.engine.inputs import StepInputs
from resident.engine.latency import RequestLatency
from resident.engine.launch_window import LaunchWindow, poll_until
from resident.engine.phases import NO_PHASES, PhaseTiming
from resident.engine.planning import HostPlanning, PreparedStep, StepPlanning, planner_refusal
from resident.engine.prefix import NoPrefixCache, PrefixCache
from resident.engine.readback import TokenReadback
from resident.engine.report import engine_info, engine_stats, rowcheck_counts
from resident.engine.request import Request, Status
from resident.engine.resident_planning import ResidentPlanning
from resident.engine.runner import StepRunner
from resident.engine.sampler import FAILED_DRAW, Sampler, SampleRow, StepLogits
from resident.engine.sampling_state import SamplingSlots
from resident.engine.scheduler import Scheduler, StepPlan
from resident.engine.startup import StartupTimes
from resident.engine.swap import StateSwapper
from resident.engine.token_ring import TokenRing
from resident.engine.types import (
    FINISH_ABORT,
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_STOP,
    EngineRequest,
    RequestOutput,
    TokenLogprobs,
)
from resident.heap import GcPauses
from resident.kernels.pdl import pdl_on
from resident.model.cache import ModelCache
from resident.model.config import ModelConfig
from resident.model.dense import build_dense_ops
from resident.model.weights import load_model, torch_dtype, weights_fingerprint
from resident.parallel.group import RankGroup, single_rank
from resident.parallel.shard import RankShard
from resident.planner import ResidentPlanner
from resident.planner.rowcheck import RowCheck
from resident.resources.kv import KVPool
from resident.resources.positions import Positions
from resident.resources.recurrent import StatePool

log = logging.getLogger("resident.engine")

NODE = "llm"
KV_POOL_KEY = "kv"


def ids_outside(ids: list[int], vocab_size: int) -> bool:
    """Whether a non-empty list of token ids holds one outside [0, vocab_size): min and max,
    passes in C, a third of a Python loop's time at 1,280 ids, in the loop that also launches
    every step (resident/tools/intake_bench.py)."""
    return min(ids) < 0 or max(ids) >= vocab_size


class Engine:
    def __init__(self, model_config: ModelConfig, config: EngineConfig,
                 device: torch.device, startup: StartupTimes | None = None,
                 group: RankGroup | None = None) -> None:
        """config: resolved for this model and device type (EngineConfig.resolve); startup:
        the clock of the start-up this engine is part of (a fresh one if None); group: this
        rank's tensor-parallel group (parallel/group.py), of config.tensor_parallel ranks."""
        if not config.is_resolved or config != config.resolve(model_config, device.type):
            raise ValueError("an Engine needs its config resolved for its model and device: "
                             f"EngineConfig.resolve(model, {device.type!r})")
        self.group = group or single_rank(device)
        if self.group.size != config.tensor_parallel:
            raise ValueError(f"knob tensor_parallel={config.tensor_parallel}: this engine's "
                             f"rank group has {self.group.size} ranks (server/ranks.py)")
        self.model_config, self.config, self.device = model_config, config, device
        self.startup = startup or StartupTimes()
        self.dtype = torch_dtype(config.dtype)
        # this rank's shapes: its heads and MLP channels; pools and kernels follow them
        rank_model = self._load_model()
        self.cache = ModelCache.allocate(rank_model, config.num_kv_pages, config.page_size,
                                         config.num_state_slots, self.dtype, device,
                                         torch_dtype(config.gdn_state_dtype))
        self.kv = KVPool(config.num_kv_pages, config.page_size)
        self.states = StatePool(config.num_state_slots)
        self.positions = Positions()
        self.kernels = build_kernels(config, rank_model, self.dtype, device,
                                     self.model.dense.gdn_gates)
        self.phases = PhaseTiming() if config.phase_timing == "on" else NO_PHASES
        self.last_step_kind: str | None = None  # the last step()'s kind; None: it ran no rows
        self.inputs = StepInputs(config, self.kv, self.states, self.positions, self.kernels,
                                 self.phases, device)
        self.planning = self._build_planning()
        self.sampler = self._build_sampler()
        self.ring = TokenRing.build(config.token_ring, device, config.max_decode_rows)
        self.runner = StepRunner(self.model, self.cache, self.inputs, self.planning,
                                 self.kernels, self.phases, config.cuda_graphs == "on",
                                 self.sampler.draw_decode, config.max_step_rows, self.ring)
        self.startup.lap("buffers")
        self._warm_up(rank_model)
        self.swapper = StateSwapper(self.cache, self.kv, self.states,
                                    lambda rid: self.planning.release(rid, offload=True))
        self.prefixes = PrefixCache(config, self.cache, self.kv, self.states) \
            if config.prefix_cache == "on" else NoPrefixCache()
        self.scheduler = Scheduler(config, self.kv, self.states, self.positions, self.swapper,
                                   self.prefixes)
        self.readback = TokenReadback(device, config.max_step_rows)
        self.requests: dict[str, Request] = {}
        # plan_ahead: the next step, scheduled (and, for decode, prepared) while this one ran,
        # and the finished requests whose rows that step still holds
        self._next_plan: StepPlan | None = None
        self._prepared: PreparedStep | None = None
        self._zombies: list[Request] = []
        self._arrivals = 0
        # late_launch: the engine core's intake, polled before a step is launched ahead (it
        # returns the requests it took); None: the step launches at once
        self.intake: Callable[[], int] | None = None
        # the engine core's garbage collector pauses over its life (set by the core; stats)
        self.gc_pauses: GcPauses | None = None
        self.window = LaunchWindow()
        self.latency = RequestLatency()
        self.counters: Counter[str] = Counter()
        self.step_seconds: Counter[str] = Counter()

    def _load_model(self) -> ModelConfig:
        """The CUDA context (timed apart from the weights), then this rank's shard of the
        weights and their fingerprint; returns this rank's model config."""
        config, device, group = self.config, self.device, self.group
        if device.type == "cuda":
            torch.empty(1, device=device)
            self.startup.lap("device")
        shard = RankShard(group.rank, group.size)
        self.model = load_model(self.model_config, device, self.dtype, dense=build_dense_ops(
            config.compile == "on", pdl_on(config.pdl, device)), shard=shard)
        if group.size > 1:
            self.model.all_reduce = group.all_reduce
        if config.compile == "on":
            log.info("torch.compile on for the dense parts; Inductor cache %s",
                     os.environ.get("TORCHINDUCTOR_CACHE_DIR", "(default)"))
        self.fingerprint = weights_fingerprint(
            self.model, shard, self.model_config, group.all_reduce if group.size > 1 else None)
        self.startup.lap("model")
        return shard.model_config(self.model_config)

    def _warm_up(self, rank_model: ModelConfig) -> None:
        """Before the first request: fla's chunked delta rule tuned (CUDA), every step shape
        compiled or captured, and the decode buckets' draws captured (graphs on)."""
        config = self.config
        if self.device.type == "cuda":
            from resident.backends.gdn_prefill import tune_chunked_delta_rule

            tune_chunked_delta_rule(rank_model, config.prefill_token_budget, self.dtype,
                                    self.cache.recurrent.dtype, self.device)
            self.startup.lap("fla tuning")
        if config.cuda_graphs == "on" or config.compile == "on":
            self.runner.prepare_all(config.decode_buckets, self.startup.lap)
        if self.runner.graphs is not None:
            self.sampler.capture(config.decode_buckets, self.runner.logits_gpu)
            self.startup.lap("sampler graphs")

    def _build_planning(self) -> StepPlanning:
        config = self.config
        refusal = planner_refusal(config, (self.kv, self.states, self.positions))
        if refusal:
            log.info("resident planning off on %s: %s", NODE, refusal)
            return HostPlanning(self.inputs, refusal)
        span = self.kv.resident_span(config.max_model_len)
        planner = ResidentPlanner(config.max_decode_rows, {KV_POOL_KEY: (self.kv, span, True)},
                                  self.states, self.positions, KV_POOL_KEY, self.device)
        row_check = (RowCheck(planner, {KV_POOL_KEY: self.kv}, self.positions, self.states)
                     if config.row_check == "on" else None)
        reason = f"resident planning on {NODE}: {planner.describe()}"
        log.info(reason)
        return ResidentPlanning(planner, self.inputs, self.kernels, self.phases, row_check,
                                reason)

    def _build_sampler(self) -> Sampler:
        """Under resident planning the draw's parameters live by slot (sampling_state.py)."""
        config, planner = self.config, getattr(self.planning, "planner", None)
        slots = None if planner is None else SamplingSlots(
            planner.num_rows, config.max_decode_rows, planner.slot_ids_gpu, self.device)
        return Sampler(self.device, config.seed, self.model_config.vocab_size,
                       config.max_step_rows, config.sampler, slots, self.kernels.argmax,
                       pdl_on(config.pdl, self.device))

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, new: EngineRequest) -> RequestOutput | None:
        """Queues a request; returns its failed output at once if it can never run."""
        request = Request(new.request_id, list(new.prompt_token_ids), new.params,
                          self._arrivals, self.model_config.eos_token_ids,
                          cache_salt=new.cache_salt,
                          arrived_s=time.monotonic() if new.arrived_s is None else new.arrived_s)
        self._arrivals += 1
        error = self._reject_reason(request)
        if error:
            self.counters["failed_requests"] += 1
            return RequestOutput(request.request_id, [], True, FINISH_ERROR, error, rejected=True)
        self.requests[request.request_id] = request
        self.sampler.add(request.request_id, request.params)
        self.prefixes.add(request)
        self.scheduler.add(request)
        return None

    def _reject_reason(self, request: Request) -> str | None:
        if request.request_id in self.requests:
            return f"request id {request.request_id!r} is already running"
        if not request.prompt_ids or request.params.max_tokens < 1:
            return "a request needs a prompt and max_tokens >= 1"
        vocab = self.model_config.vocab_size
        if ids_outside(request.prompt_ids, vocab):
            return f"prompt token ids must be in [0, {vocab})"
        return self.scheduler.never_fits(request)

    def abort(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is not None and request not in self._zombies:
            request.finish_reason = request.finish_reason or FINISH_ABORT
            self._finish(request)
            self.counters["aborts"] += 1

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # -- one step ---------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One step: schedule (or take the step planned ahead), launch, sample, commit, plan
        the next step ahead (plan_ahead), read the tokens back (the one wait for the GPU),
        emit. Its wall time adds to the stats' step_seconds of its kind."""
        self.phases.open()
        started = time.perf_counter()
        plan, self._next_plan = self._next_plan or self.scheduler.schedule(), None
        self.phases.lap("schedule")
        outputs = []
        self.last_step_kind = plan.kind if plan.rows else None
        if plan.rows:
            self.phases.kind(plan.kind)
            outputs = self._run(plan)
            self.step_seconds[plan.kind] += time.perf_counter() - started
        self.phases.close()
        return outputs

    def _run(self, plan: StepPlan) -> list[RequestOutput]:
        prepared = self._prepared if self._prepared and self._prepared.plan is plan \
            else self._prepare(plan)
        self._prepared = None
        # [sampling rows (then padding), vocab] logits, and a decode graph's argmax and draw
        step = prepared.logits if prepared.logits is not None else self._launch(prepared)
        # a row whose request finished after this step was planned (one of the zombies) runs,
        # unsampled
        sampling = plan.sampling
        kept = [i for i, r in enumerate(sampling) if not r.finish_reason] \
            if self._zombies else None
        live = sampling if kept is None else [sampling[i] for i in kept]
        drawn = self._sample(prepared, step, sampling, kept) if live else None
        self.phases.lap("sampler")
        self._commit(prepared, live)
        if self.config.plan_ahead != "off":
            self._ahead(prepared, live, drawn)
        tokens = self._read_tokens(prepared, bool(live))
        logprobs = (self.readback.logprobs() if live else None) or [None] * len(tokens)
        failed = {live[row].request_id: FAILED_DRAW for row in self.readback.failed()} \
            if live else {}
        outputs = [self._emit(request, token, token_logprobs, failed.get(request.request_id))
                   for request, token, token_logprobs in zip(live, tokens, logprobs, strict=True)]
        self.counters["generated_tokens"] += len(outputs) - len(failed)
        if not prepared.is_decode:  # a first token comes from the step with its prompt's last
            self._first_tokens(live)
        self.phases.lap("outputs")
        if self._prepared and self._prepared.logits is None:  # before these outputs leave
            self._launch_ahead(None)
        return outputs

    def _ahead(self, running: PreparedStep, live: list[Request],
               drawn: tuple[torch.Tensor, list[int] | None] | None) -> None:
        """plan_ahead: the next step scheduled and prepared while this one runs; under
        `launch` also launched (a decode step only where this one sampled: its ids come from
        the `live` rows' `drawn` tokens on the device, _sample's), after late_launch's window
        for arrivals."""
        windowed = self._await_arrivals(running)
        lead_s = time.perf_counter()
        self._plan_next()
        if self._prepared and self.config.plan_ahead == "launch" \
                and (live or not self._prepared.is_decode):
            sampled = None
            if drawn is not None:
                tokens_gpu, positions = drawn
                sampled = SampledTokens(tokens_gpu, _index_of(live, positions))
            self._launch_ahead(sampled)
            self.counters[f"launched_ahead_{self._prepared.plan.kind}"] += 1
            if windowed and self._prepared.is_decode:  # what a window without arrivals leads
                self.window.led(time.perf_counter() - lead_s)

    def _read_tokens(self, prepared: PreparedStep, sampled: bool) -> list[int]:
        """Waits for the step's tokens (the step's one wait for the GPU) and reads them (none
        where it sampled no row); late_launch's window learns the step's GPU time from it. A
        step that samples no row (prompt chunks only) still waits: without it two such steps
        in a row turn the host ring over copies the GPU has not run yet (buffers.py), and a
        step reads another step's rows (an illegal address)."""
        tokens: list[int] = []
        wait_s = time.perf_counter()
        if sampled:
            tokens = self.phases.event_sync(self.readback.wait)
        else:
            self.phases.event_sync(self.readback.sync)
        read_s = time.perf_counter()
        self.phases.lap("sample_sync")
        if self.intake is not None:
            # on CPU the tokens were there when the launch returned: a read slowed by the
            # host (a busy machine) is no GPU time, and would open windows that only spin
            waited_s = read_s - wait_s if self.device.type == "cuda" else 0.0
            self.window.read(prepared.bucket, prepared.launched_s, read_s, waited_s)
        return tokens

    def _sample(self, prepared: PreparedStep, step: StepLogits, sampling: list[Request],
                kept: list[int] | None) -> tuple[torch.Tensor, list[int] | None]:
        """Takes every sampling row's token (a decode step's draw ran in its graph and covers
        its bucket, finished rows included; a varlen step's rows are drawn now) and starts the
        read-back of the `kept` rows' (None: all) tokens, failures and logprobs; returns the
        tokens on the device and the kept rows' places among them (None: the first rows, in
        order). A decode step makes no pass over its rows here unless a request asks for
        logprobs; one whose launch published its tokens (StepLogits.published) queues no copy
        either."""
        if step.published is not None and not self.sampler.any_logprobs:
            drawn = step.drawn
            tokens = step.greedy if drawn is None else drawn.tokens
            self.readback.start_published(self.ring, step.published, prepared.bucket,
                                          drawn is not None, len(sampling), kept)
            return tokens, kept
        if prepared.is_decode:
            drawn = None if step.drawn is None else step.drawn.first(len(sampling))
        else:
            drawn = self.sampler.sample(step, [_sample_row(r) for r in sampling])
        logits = step.logits
        tokens = drawn.tokens if drawn else self.sampler.greedy(step, len(sampling))
        failed, packed = (drawn.failed, drawn.packed) if drawn else (None, None)
        if kept is not None:  # new tensors: read back apart
            tokens, logits = tokens[kept], logits[kept]
            failed, packed = None if failed is None else failed[kept], None
            sampling = [sampling[i] for i in kept]
        logprobs = self.sampler.logprobs(logits, tokens, [_sample_row(r) for r in sampling]) \
            if self.sampler.any_logprobs else None
        self.readback.start(tokens, logprobs, failed, packed)
        return tokens, None

    def _await_arrivals(self, running: PreparedStep) -> bool:
        """late_launch: before the step after a running decode step is scheduled, the engine
        core's intake is polled until a request arrives or the step must launch
        (launch_window.py); whether it polled. Only where an arrival could join that step: no
        request already waits and a sequence is free."""
        if self.intake is None or self.config.plan_ahead != "launch" or not running.is_decode \
                or not self.scheduler.could_admit():
            return False
        deadline = self.window.deadline(running.bucket, running.launched_s)
        self.counters["window_arrivals"] += self.phases.window(
            lambda: poll_until(deadline, self.intake))
        return True

    def _launch_ahead(self, sampled: SampledTokens | None) -> None:
        """Launches the prepared next step inside this one (its phases are its own)."""
        with self.phases.ahead(self._prepared.plan.kind):
            self._prepared.logits = self._launch(self._prepared, sampled)

    def _prepare(self, plan: StepPlan) -> PreparedStep:
        """What can be done before the step's token ids are known: a decode step's staging
        (planning.py); a varlen step stages at launch."""
        if plan.kind == "decode":
            return self.planning.prepare_decode(plan)
        return PreparedStep(plan)

    def _launch(self, prepared: PreparedStep, sampled: SampledTokens | None = None):
        """Uploads a prepared decode step's token ids (a varlen step: stages and uploads its
        rows, and its prefill backend plans), moves the read-back's event past them (so the
        wait that returns the last step's tokens also frees their host sources), runs it. Ids
        the last step sampled and has not read back come from `sampled` on the device."""
        if not prepared.is_decode:
            staged = self.inputs.varlen.stage(prepared.plan, sampled)
            launch = self.runner.plan_varlen(prepared.plan, staged)
            self.readback.mark()
            logits = launch()
        else:
            self.planning.upload_decode(prepared, sampled)
            draws = self._stage_draw(prepared)
            self.readback.mark()
            logits = self.runner.launch_decode(prepared.bucket, prepared.width, draws)
        prepared.launched_s = time.perf_counter()
        return logits

    def _stage_draw(self, prepared: PreparedStep) -> bool:
        """A decode step's sampling parameters, staged before its forward (its graph draws
        after the forward); whether it draws. Under resident slots only the rows the planner
        wrote whole are written; host-planned, every row is uploaded when one samples."""
        if self.sampler.by_slot(prepared.bucket):
            whole = [(slot, _sample_row(self.requests[rid]))
                     for slot, rid in prepared.staged.whole_rows] if prepared.staged else []
            draws = self.sampler.stage_by_slot(whole)
        else:  # every decode row samples
            draws = self.sampler.stage_rows([_sample_row(request)
                                             for request in prepared.plan.sampling])
        self.phases.lap("sampler")
        return draws

    def _commit(self, prepared: PreparedStep, live: list[Request]) -> None:
        """What the step did that needs no token value: the streams advance, each sampling row
        takes a pending token (and length is decided), planning follows; requests that finished
        on length, or while the step was planned ahead, are released."""
        plan = prepared.plan
        self.counters[f"steps_{plan.kind}"] += 1
        for row in plan.rows:
            self.kv.commit(row.request.request_id, row.num_new)
            row.request.num_computed += row.num_new
            if plan.kind != "decode":  # its prompt pages and snapshots, after the step
                self.prefixes.commit(row.request)
        for request in live:
            request.append_pending()
        self.phases.lap("commit")
        self.planning.commit(prepared)
        # the requests max_tokens finished go now (their last token is read back later): every
        # step that could reuse their pages or slot is queued behind this one on the stream
        done = [request for request in live if request.finish_reason]
        zombies, self._zombies = self._zombies, []
        for request in zombies + done:
            self._release(request)
        self.phases.lap("commit")

    def _plan_next(self) -> None:
        """Schedules the next step while this one runs on the GPU and prepares it (a decode
        step's staging; a varlen step stages at launch): its host staging is written only
        after the previous step's read-back, which orders every earlier upload from the same
        host buffers before it. A plan with no rows is dropped: the next step() schedules
        afresh, with whatever arrived meanwhile."""
        plan = self.scheduler.schedule()
        self.phases.lap("schedule")
        if plan.rows:
            self._next_plan = plan
            with self.phases.ahead(plan.kind):
                self._prepared = self._prepare(plan)

    def _emit(self, request: Request, token: int, logprobs: TokenLogprobs | None,
              error: str | None = None) -> RequestOutput:
        """The request's token (and its logprobs); a request whose own step work failed
        (`error`) finishes alone, the rest of its step unharmed."""
        if error is not None:
            log.error("request %s failed: %s", request.request_id, error)
            request.finish_reason = FINISH_ERROR
            self.counters["failed_requests"] += 1
            self._finish(request)
            return RequestOutput(request.request_id, [], True, FINISH_ERROR, error)
        request.resolve(token)
        if request.finish_reason:
            self._ended(request)
            if request.status is not Status.FINISHED:
                self._finish(request)
        # by position: a NamedTuple's keywords cost ~0.25 us more a row, 256 rows a step
        return RequestOutput(request.request_id, [token], bool(request.finish_reason),
                             request.finish_reason, None, False, request.num_cached_tokens,
                             None if logprobs is None else (logprobs,))

    def _first_tokens(self, requests: list[Request]) -> None:
        """Times the requests of a varlen step whose first token just left (latency.py)."""
        now = time.monotonic()
        for request in requests:
            if request.first_token_s is None and request.finish_reason != FINISH_ERROR:
                request.first_token_s = now
                self.latency.first_token(request.arrived_s, request.admitted_s, now)

    def _ended(self, request: Request) -> None:
        """A request's last token left: timed if it stopped or reached its length (an aborted
        row can still emit the token of a step that was running)."""
        if request.finish_reason in (FINISH_STOP, FINISH_LENGTH):
            self.latency.finished(request.arrived_s, request.first_token_s,
                                  len(request.output_ids), time.monotonic())

    def _finish(self, request: Request) -> None:
        """A finished or aborted request is released now, or after the step planned ahead
        that still holds its row."""
        if self._next_plan and any(row.request is request for row in self._next_plan.rows):
            self._zombies.append(request)
            self.counters["rows_after_finish"] += 1
        else:
            self._release(request)

    def _release(self, request: Request) -> None:
        self.planning.release(request.request_id)
        self.scheduler.release(request)
        self.swapper.drop(request.request_id)
        self.prefixes.drop(request.request_id)
        self.sampler.drop(request.request_id)
        del self.requests[request.request_id]

    # -- reporting --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters and gauges for /metrics and /debug/rowcheck (report.py)."""
        return engine_stats(self)

    def slot_holders(self) -> list[str]:
        """The requests that hold resident planner slots (none under host planning): what
        tensor-parallel ranks must agree on after each step (parallel/lockstep.py)."""
        planner = getattr(self.planning, "planner", None)
        return [] if planner is None else list(planner.holders())

    def rowcheck_counts(self) -> dict[str, int]:
        """/debug/rowcheck (report.py)."""
        return rowcheck_counts(self)

    def info(self) -> dict[str, Any]:
        """What /debug/config and /v1/models report (report.py)."""
        return engine_info(self)


def _sample_row(request: Request) -> SampleRow:
    return SampleRow(request.request_id, request.params, len(request.output_ids))


def _index_of(live: list[Request], positions: list[int] | None) -> dict[str, int]:
    """Each live request's row among a step's tokens on the device (positions None: the
    first rows, in order)."""
    if positions is None:
        return {request.request_id: row for row, request in enumerate(live)}
    return {request.request_id: row for request, row in zip(live, positions, strict=True)}


def build_engine(model_config: ModelConfig, knobs: EngineConfig,
                 device: torch.device | str) -> Engine:
    """An Engine from knobs as given (autos unfilled), resolved here for the model and device:
    for in-process users (tests, benches); `resident serve` resolves in its CLI."""
    device = torch.device(device)
    return Engine(model_config, knobs.resolve(model_config, device.type), device)
