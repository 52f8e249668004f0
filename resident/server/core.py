"""The engine-core process: owns the device, steps the engine, streams outputs to the API.

It connects to the two pipes each API process bound, builds the engine, sends Ready to each,
then loops: drain requests (blocking briefly only when idle), run one step, send that step's
outputs (one message an API process, its own requests' outputs: routing.py), and to each API
process at least every HEARTBEAT_S a message of some kind, so it can tell a stuck or dead core
from a quiet one. It exits on Shutdown or when its parent process is gone. Under `phase_timing` each
loop that runs a step is timed from its intake to its outputs sent (engine/phases.py); the idle
wait is outside it. A profile window (POST /debug/profile, profile_window.py) marks the same
loops. Under `late_launch` a step also takes the requests that arrive before it launches the
next step ahead (engine/launch_window.py); the API's other messages wait for the loop's
intake.

Failures: a request that cannot be added fails alone (its output carries why). An error the
engine's step raises is not tied to one request (the engine fails a request's own step work
alone, engine.py `_emit`): the core logs its traceback, sends Fatal with its one-line summary
(never the traceback: that goes to the log, the API's clients get the summary) and exits.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq

from resident.config import EngineConfig, parse_cpu_list
from resident.engine.startup import StartupTimes
from resident.engine.types import FINISH_ERROR, RequestOutput
from resident.lifecycle import die_with_spawner
from resident.model.config import ModelConfig
from resident.server.profile_window import ProfileWindows, profile_dir
from resident.server.protocol import (
    AbortRequest,
    AddRequest,
    ApiGone,
    Fatal,
    ProfileQuery,
    Ready,
    Shutdown,
    StatsQuery,
    StatsReply,
)
from resident.server.routing import OutputRouter

if TYPE_CHECKING:  # ranks.py imports torch, which the API processes that import this never do
    from resident.server.ranks import Followers

log = logging.getLogger("resident.core")
IDLE_POLL_MS = 50
# core_idle_spin=on: how long a core out of work polls without waiting. It covers the gap
# between one request's end and the next one's arrival of a client that sends its next request
# as its last one ends (~1.5 ms on an H100 host at c=1, 2-5 on the project's VM), at the cost
# of one CPU spinning at most that long each time the core runs out of work
IDLE_SPIN_S = 0.005
HEARTBEAT_S = 1.0


def run_engine_core(model_config: ModelConfig, config: EngineConfig, device: str,
                    request_addrs: Sequence[str], output_addrs: Sequence[str],
                    log_level: str = "INFO") -> None:
    """Process entry point (spawned by `resident serve`): `config` resolved for `device`
    (cpu or cuda) by the CLI; one request and one output address per API process, in its
    api_index order."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parent = die_with_spawner()
    context = zmq.Context()
    requests = context.socket(zmq.PULL)  # fair-queued over every API process
    for addr in request_addrs:
        requests.connect(addr)
    outputs = OutputRouter(context, output_addrs, HEARTBEAT_S, config.stream_interval)
    followers: Followers | None = None
    try:
        from resident.server.ranks import start_followers

        startup = StartupTimes()
        followers = start_followers(model_config, config, device, log_level)
        engine = build_core_engine(model_config, config, device, startup,
                                   followers.group if followers else None)
        log.info("%s", engine.startup.line())
        outputs.broadcast(Ready(engine.info()))
        _serve(engine, requests, outputs, parent=parent, followers=followers)
    except Exception as error:  # noqa: BLE001 - the API process must learn why, whatever it was
        log.exception("engine core failed")
        outputs.broadcast(Fatal(f"{type(error).__name__}: {error}"))
    finally:
        if followers is not None:
            followers.stop()
        requests.close(linger=0)
        outputs.close(linger_ms=1000)
        context.term()


def build_core_engine(model_config: ModelConfig, config: EngineConfig, device_name: str,
                      startup: StartupTimes, group=None):
    """The engine as the engine core builds it: pinned to its step cores, its torch threads
    set, the heap frozen once built, the knobs and planning mode logged. Also what the
    in-process half of gate/tools/served_ratio.py runs (resident/tools/closed_loop.py).
    group: this rank's tensor-parallel RankGroup (server/ranks.py), None on one rank."""
    import torch

    if config.compile == "on":  # torch.compile's ~1.5-4 s of imports, timed as such
        import torch._dynamo  # noqa: F401

    from resident.engine.engine import Engine
    from resident.heap import GcPauses, freeze_heap, set_young_threshold

    startup.lap("imports")
    if device_name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--device cuda: torch {torch.__version__} sees no CUDA device")

    rank = 0 if group is None else group.rank
    cores = rank_cores(step_cores(config, sorted(os.sched_getaffinity(0))), rank,
                       config.tensor_parallel)
    if cores:
        os.sched_setaffinity(0, cores)
        log.info("step thread on CPUs %s (step_thread_cores=%s)", cores,
                 config.step_thread_cores)
    torch.set_num_threads(torch_threads(config, device_name, sorted(os.sched_getaffinity(0))))
    device = torch.device(device_name) if group is None else group.device
    engine = Engine(model_config, config, device, startup, group)
    freeze_heap()
    set_young_threshold(config.gc_young_threshold)
    engine.gc_pauses = GcPauses().start()  # for the core's life: /metrics
    log.info("model %s on %s (%s), weights %s, %d torch threads on CPUs %s",
             model_config.name, device_name, engine.dtype, engine.fingerprint,
             torch.get_num_threads(), sorted(os.sched_getaffinity(0)))
    info = engine.info()
    log.info("knobs changed from defaults: %s", info["knobs_changed"] or "none")
    log.info("%d KV pages of %d tokens, %d GDN state slots", config.num_kv_pages,
             config.page_size, config.num_state_slots)
    log.info("planning mode: %s (%s)", info["planning_mode"], info["planning_reason"])
    return engine


def step_cores(config: EngineConfig, allowed: list[int]) -> list[int]:
    """The CPUs the engine core pins to: step_thread_cores as given, or for `auto` the two
    lowest allowed CPUs outside api_core, two a tensor-parallel rank (all allowed CPUs when
    fewer remain); [] unpinned. Each rank takes its share (rank_cores)."""
    if config.step_thread_cores != "auto":
        return parse_cpu_list(config.step_thread_cores, "step_thread_cores")
    api = set(parse_cpu_list(config.api_core, "api_core"))
    free = [cpu for cpu in allowed if cpu not in api]
    wanted = 2 * config.tensor_parallel
    return free[:wanted] if len(free) >= wanted else allowed


def rank_cores(cores: list[int], rank: int, ranks: int) -> list[int]:
    """A tensor-parallel rank's share of the step cores: an equal run of them each, so the
    ranks' step threads do not contend; all of them when there are fewer cores than ranks."""
    if ranks == 1 or len(cores) < ranks:
        return cores
    share = len(cores) // ranks
    return cores[rank * share:(rank + 1) * share]


def torch_threads(config: EngineConfig, device_type: str, allowed: list[int]) -> int:
    """The engine core's torch threads, from the CPUs it may run on (`allowed`, after
    step_cores): on CPU one a CPU outside api_core, less one for the API process and the load
    client when api_core does not put them elsewhere; on CUDA, where the forward runs on the GPU,
    at most 2 for the host's few tensor ops. At least 1. More threads than free CPUs wait on each
    other at every op: a tiny-model decode step on a busy 2-CPU host took ~10x longer on 2
    threads than on 1."""
    api = set(parse_cpu_list(config.api_core, "api_core"))
    free = [cpu for cpu in allowed if cpu not in api]
    if device_type != "cpu":
        return max(1, min(2, len(free)))
    return max(1, len(free) - (0 if api else 1))


@dataclass
class _Boundary:
    """What one step boundary's intake did to the engine, for the tensor-parallel followers
    (server/ranks.py): its adds and aborts in order, and the stats queries that wait for every
    rank's row-check counts."""

    inputs: list[tuple[str, Any]] = field(default_factory=list)
    stats_queries: list[StatsQuery] = field(default_factory=list)


def _serve(engine, requests: zmq.Socket, outputs: OutputRouter, parent: int,
           followers: Followers | None = None) -> None:
    phases = engine.phases
    profiling = ProfileWindows(profile_dir(engine.config.profile_dir), engine.device.type)
    spin_s = IDLE_SPIN_S if engine.config.core_idle_spin == "on" else 0.0
    late_launch = engine.config.late_launch == "on"
    deferred: list[Any] = []  # what a step's window left to its boundary, in arrival order
    worked_s = time.monotonic()
    while os.getppid() == parent:
        pending: list[RequestOutput] = []
        outputs.heartbeat()
        if followers is not None:
            followers.check()  # a rank that died while the server idles fails it now
        closed = profiling.poll()
        if closed is not None:
            query, answer = closed
            outputs.send(query.api_index, StatsReply(query.nonce, answer))
        if not engine.has_work() and not deferred \
                and not input_arrived(requests, worked_s + spin_s):
            continue  # idle: waited outside any timed step
        phases.open()  # a step is timed from this intake to its outputs sent
        profiling.open_step()
        boundary = _Boundary()

        def handle(one, pending=pending, boundary=boundary) -> bool:
            return _handle(engine, one, pending, outputs, profiling, boundary,
                           followers is not None)

        taken, deferred = deferred, []
        while requests.poll(0):
            taken.append(requests.recv_pyobj())
        # an API process sends what one turn of its event loop queued as one list
        if not all(handle(one) for one in _each_message(taken)):
            return
        phases.lap("intake")
        if late_launch:
            engine.intake = functools.partial(_window_intake, requests, handle, deferred)
        kind = _step(engine, followers, boundary, pending)
        if boundary.stats_queries:
            _answer_with_ranks(engine, followers, boundary.stats_queries, outputs)
        if pending:
            outputs.send_outputs(pending)
        phases.lap("outputs")
        profiling.close_step(kind)
        phases.close()
        worked_s = time.monotonic()
    log.warning("the API process is gone; engine core exits")


def _each_message(received: list[Any]) -> Iterator[Any]:
    """The messages of what was received, in order: an API process sends what one turn of its
    event loop queued as one list."""
    for message in received:
        yield from message if isinstance(message, list) else (message,)


def _window_intake(requests: zmq.Socket, handle: Callable[[Any], bool],
                   deferred: list[Any]) -> int:
    """late_launch's poll inside a step (Engine.intake): the new requests of what arrived are
    taken now; any other message, and all that arrives after it, waits in `deferred` for the
    step's boundary, so messages still act in the order they came. The requests it took."""
    if deferred or not requests.poll(0):
        return 0
    took = 0
    for one in _each_message([requests.recv_pyobj()]):
        if deferred or not isinstance(one, AddRequest):
            deferred.append(one)
        else:
            handle(one)
            took += 1
    return took


def input_arrived(requests: zmq.Socket, spin_until_s: float) -> bool:
    """Whether a message from an API process is there: polled without a wait until
    `spin_until_s` (core_idle_spin), then waited for up to IDLE_POLL_MS."""
    while time.monotonic() < spin_until_s:
        if requests.poll(0):
            return True
    return bool(requests.poll(IDLE_POLL_MS))


def _step(engine, followers: Followers | None, boundary: _Boundary,
          pending: list[RequestOutput]) -> str | None:
    """The boundary's beat to the followers (when there is anything to tell them), then the
    step if there is work; the step's kind (None: no step)."""
    step = engine.has_work()
    if followers is not None and (boundary.inputs or step or boundary.stats_queries):
        followers.beat(boundary.inputs, step, gather_rowcheck=bool(boundary.stats_queries))
    if not step:
        return None
    pending.extend(engine.step() if followers is None else followers.step(engine))
    return engine.last_step_kind


def _answer_with_ranks(engine, followers: Followers, queries: list[StatsQuery],
                       outputs: OutputRouter) -> None:
    """Stats whose row check covers every rank: rank 0's counts as before, and each rank's
    under `ranks` (the followers send theirs after the beat that asked)."""
    stats = engine.stats()
    stats["rowcheck"]["ranks"] = followers.gather_rowcheck(engine.rowcheck_counts())
    for query in queries:
        outputs.send(query.api_index, StatsReply(query.nonce, stats))


def _handle(engine, message, pending: list[RequestOutput], outputs: OutputRouter,
            profiling: ProfileWindows, boundary: _Boundary, ranked: bool) -> bool:
    """One message from an API process; False on Shutdown. `ranked`: tensor parallel, the
    boundary records what the followers must replay."""
    if isinstance(message, AddRequest):
        outputs.own(message.request.request_id, message.api_index)
        failed = _add(engine, message)
        if failed is not None:
            pending.append(failed)
        boundary.inputs.append(("add", message.request))
    elif isinstance(message, AbortRequest):
        _abort(engine, message.request_id, boundary)
        outputs.disown(message.request_id)
    elif isinstance(message, StatsQuery) and ranked and message.section == "stats":
        boundary.stats_queries.append(message)
    elif isinstance(message, StatsQuery):
        outputs.send(message.api_index,
                     StatsReply(message.nonce, _answer(engine, message.section)))
    elif isinstance(message, ProfileQuery):
        refused = profiling.request(message)
        if refused is not None:
            outputs.send(message.api_index, StatsReply(message.nonce, refused))
    elif isinstance(message, ApiGone):
        owned = outputs.gone(message.api_index)
        for request_id in owned:
            _abort(engine, request_id, boundary)
        log.warning("API process %d is gone: aborted its %d requests; %d API processes left",
                    message.api_index, len(owned), outputs.num_live)
    elif isinstance(message, Shutdown):
        return False
    return True


def _abort(engine, request_id: str, boundary: _Boundary) -> None:
    engine.abort(request_id)
    boundary.inputs.append(("abort", request_id))


def _add(engine, message: AddRequest) -> RequestOutput | None:
    """engine.add_request; an error in it fails that request alone."""
    try:
        return engine.add_request(message.request)
    except Exception as error:  # noqa: BLE001 - this request's failure, not the core's
        request_id = message.request.request_id
        log.exception("adding request %s failed", request_id)
        return RequestOutput(request_id, [], True, FINISH_ERROR,
                             f"the engine could not take the request: {type(error).__name__}")


def _answer(engine, section: str) -> dict:
    """A StatsQuery's answer: the stats, or the phase timing (then reset, for phases_reset)."""
    if section == "stats":
        return engine.stats()
    report = {"enabled": engine.config.phase_timing == "on", "kinds": engine.phases.report()}
    if section == "phases_reset":
        engine.phases.reset()
    return report


