"""`resident serve`: the first API process, which spawns the engine-core process (and, with
`--api-processes N`, N-1 more API processes on the same port: api_processes.py) and serves HTTP.

The API processes never import torch (`--device auto` asks it which device there is, once).
Before anything starts the first binds the port (a port in use is one clear error) and removes
IPC directories that killed servers left behind. It then spawns the core, answers /health with
503 until the core says Ready, and watches it (each API process does, for its own requests):

- the core exits, or sends Fatal: every request in flight ends with an error (an SSE error
  event and [DONE], or a 503), /health says "failed", and `serve` exits 1 (a supervisor
  restarts it);
- the core sends nothing for `core_stall_s` (stuck: stopped, deadlocked): the same, and the core
  is killed (from `health_stall_s` on, /health already says "stalled");
- SIGTERM or SIGINT: intake stops at once (new completions get 503, /health says "draining"),
  requests in flight drain for up to `shutdown_grace_s`, the rest are aborted (finish_reason
  `abort`, "the server is shutting down"), and `serve` exits 0. Each step is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from resident import eventloop
from resident.config import EngineConfig, parse_cpu_list
from resident.heap import freeze_heap
from resident.model.config import ModelConfig
from resident.server import jsonenc
from resident.server.api import SHUTTING_DOWN, create_app
from resident.server.api_processes import METRICS_DIR_ENV, ApiProcesses
from resident.server.chat_template import ChatTemplate, load_chat_template
from resident.server.client import EngineClient, EngineUnavailable
from resident.server.connections import ConnectionLimits, bind, connection_cap, serve_http
from resident.server.core import run_engine_core
from resident.server.protocol import IPC_PREFIX, PID_FILE
from resident.server.state import STATE, ApiState
from resident.server.tokenizer import load_tokenizer

log = logging.getLogger("resident.serve")
WATCH_S = 0.5
HANDLERS_FINISH_S = 2.0  # for handlers to write the errors their streams ended with


@dataclass(frozen=True)
class ServeOptions:
    model_config: ModelConfig
    engine_config: EngineConfig  # resolved for the device
    device: str  # cpu | cuda
    host: str
    port: int
    api_key: str | None
    log_level: str
    api_processes: int = 1  # API processes on the port (api_processes.py)


def serve(options: ServeOptions) -> int:
    """Runs the server until SIGINT/SIGTERM (exit 0) or an engine failure (exit 1); 2 when it
    cannot start (the port is taken)."""
    logging.basicConfig(level=options.log_level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    quiet_parse_errors()
    try:
        limits = connection_limits(options.engine_config)
        chat_template(options)  # a checkpoint's template that does not compile stops it here
    except ValueError as error:
        log.error("%s", error)
        return 2
    try:
        sock = bind(options.host, options.port, reuse_port=options.api_processes > 1)
    except OSError as error:
        log.error("%s", error.strerror)
        return 2
    log.info("%d API process%s on port %d (--api-processes; 0 derives it from the CPUs and "
             "max_num_seqs)", options.api_processes, "es" if options.api_processes > 1 else "",
             options.port)
    if options.api_key is None and options.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s with no API key: anyone who can reach this port can use "
                    "it (--api-key or RESIDENT_API_KEY)", options.host)
    removed = remove_stale_ipc_dirs(Path(tempfile.gettempdir()))
    if removed:
        log.info("removed %d IPC directories of servers that are gone", removed)
    try:
        return eventloop.run(_serve(options, sock, limits), options.engine_config.event_loop)
    finally:
        if METRICS_DIR_ENV in os.environ:
            shutil.rmtree(os.environ[METRICS_DIR_ENV], ignore_errors=True)


def chat_template(options: ServeOptions) -> ChatTemplate:
    """The checkpoint's chat template (or the fallback); ValueError if it does not compile."""
    model_dir = options.model_config.weights
    return load_chat_template(model_dir if Path(model_dir).is_dir() else None)


def connection_limits(config: EngineConfig) -> ConnectionLimits:
    """The listener's limits from the knobs, max_connections checked against the descriptor
    limit (ValueError naming it)."""
    return ConnectionLimits(connection_cap(config.max_connections), config.keepalive_timeout_s,
                            config.read_timeout_s, config.send_stall_s,
                            config.send_buffer_kib << 10)


async def _serve(options: ServeOptions, sock: socket.socket, limits: ConnectionLimits) -> int:
    """The first API process: spawns the core and the other API processes, serves, and on the
    way out waits for them."""
    ipc_dir = Path(tempfile.mkdtemp(prefix=IPC_PREFIX))
    (ipc_dir / PID_FILE).write_text(str(os.getpid()))
    try:
        core = _spawn_core(options, ipc_dir)
        others = ApiProcesses(options, ipc_dir, core.pid, limits)
        # pinned only after the spawns: the core must not inherit the API's one CPU
        api_cpus = parse_cpu_list(options.engine_config.api_core, "api_core")
        if api_cpus:
            os.sched_setaffinity(0, api_cpus)
        try:
            return await serve_api(options, sock, limits, 0, ipc_dir, _ChildCore(core), others)
        finally:
            others.join(options.engine_config.shutdown_grace_s + HANDLERS_FINISH_S + 5)
            core.join(timeout=10)
            if core.is_alive():
                core.kill()
    finally:
        shutil.rmtree(ipc_dir, ignore_errors=True)


async def serve_api(options: ServeOptions, sock: socket.socket, limits: ConnectionLimits,
                    api_index: int, ipc_dir: Path, core: CoreHandle,
                    others: ApiProcesses | None = None) -> int:
    """One API process: its pipes to the core, its app on `sock`, until stopped (the exit
    code); `others`, in the first process, are the other API processes it watches."""
    client = EngineClient(*pipe_addrs(ipc_dir, api_index), api_index)
    client.start()
    model_dir = options.model_config.weights
    tokenizer = load_tokenizer(model_dir if Path(model_dir).is_dir() else None,
                               options.model_config.vocab_size)
    app = create_app(client, tokenizer, options.model_config.name, options.api_key,
                     options.engine_config, chat_template(options))
    runner = await serve_http(app, sock, limits)
    freeze_heap()
    log.info("API process %d (pid %d) listening on http://%s:%d (stream events: %s, "
             "event loop: %s)", api_index, os.getpid(), options.host, options.port,
             jsonenc.ENCODER, eventloop.running_name())
    try:
        return await _until_stopped(app[STATE], core, others)
    finally:
        await runner.cleanup()
        await client.close()


def pipe_addrs(ipc_dir: Path, api_index: int) -> tuple[str, str]:
    """An API process's request and output pipe addresses."""
    return f"ipc://{ipc_dir}/requests-{api_index}", f"ipc://{ipc_dir}/outputs-{api_index}"


def _spawn_core(options: ServeOptions, ipc_dir: Path) -> multiprocessing.Process:
    addrs = [pipe_addrs(ipc_dir, i) for i in range(options.api_processes)]
    context = multiprocessing.get_context("spawn")
    core = context.Process(
        target=run_engine_core, name="resident-core", daemon=True,
        args=(options.model_config, options.engine_config, options.device,
              [request for request, _ in addrs], [output for _, output in addrs],
              options.log_level),
    )
    core.start()
    log.info("engine core started (pid %d)", core.pid)
    return core


class CoreHandle:
    """How an API process learns the core process is gone, and stops a stuck one."""

    def exit_reason(self) -> str | None:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError


class _ChildCore(CoreHandle):
    """The first API process's view: the core is its child."""

    def __init__(self, process: multiprocessing.Process) -> None:
        self._process = process

    def exit_reason(self) -> str | None:
        if self._process.is_alive():
            return None
        return f"the engine core exited with code {self._process.exitcode}"

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()


class SiblingCore(CoreHandle):
    """Another API process's view: the core is its sibling, known by pid; the first API
    process kills a stuck one."""

    def __init__(self, pid: int) -> None:
        self._pid = pid

    def exit_reason(self) -> str | None:
        return None if _alive(self._pid) else "the engine core exited"

    def kill(self) -> None:
        pass


async def _until_stopped(state: ApiState, core: CoreHandle,
                         others: ApiProcesses | None) -> int:
    """Watches the core, the other API processes and the signals (module docstring); returns
    the exit code."""
    client, config = state.client, state.limits
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # logged as the core's Ready arrives: a load shorter than WATCH_S would end before a poll
    announce = asyncio.create_task(_announce_ready(client))
    while not stop.is_set():
        failure = _core_failure(client, core, config.core_stall_s)
        if failure is not None:
            log.error("%s; failing %d requests in flight, the server exits", failure,
                      client.num_streams)
            client.fail(failure)
            core.kill()
            await _handlers_finish(state, HANDLERS_FINISH_S)
            return 1
        if others is not None:
            for api_index in others.newly_dead():
                await client.api_gone(api_index)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), WATCH_S)
    announce.cancel()
    if others is not None:
        others.stop()
    await _drain(state, config.shutdown_grace_s)
    return 0


async def _announce_ready(client: EngineClient) -> None:
    with contextlib.suppress(EngineUnavailable):
        info = await client.wait_ready()
        log.info("ready: planning mode %s (%s)", info.get("planning_mode"),
                 info.get("planning_reason"))


def _core_failure(client: EngineClient, core: CoreHandle, stall_s: float) -> str | None:
    """Why the core cannot go on, in one line, or None while it is fine."""
    if client.fatal is not None:
        return f"the engine core failed: {client.fatal}"
    exited = core.exit_reason()
    if exited is not None:
        return exited
    silent = client.silent_s
    if client.is_ready and silent > stall_s:
        return f"the engine core has not answered for {silent:.0f} s (core_stall_s = {stall_s:g})"
    return None


async def _drain(state: ApiState, grace_s: float) -> None:
    """Stops intake, lets requests in flight finish for up to grace_s, aborts the rest."""
    state.draining = True
    log.info("stopping: no new requests; draining %d in flight for up to %g s",
             state.in_flight, grace_s)
    deadline = time.monotonic() + grace_s
    while state.client.num_streams and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    aborted = state.client.abort_all(SHUTTING_DOWN)
    if aborted:
        log.warning("aborted %d requests still in flight after %g s", aborted, grace_s)
    await _handlers_finish(state, HANDLERS_FINISH_S)
    log.info("stopped")


async def _handlers_finish(state: ApiState, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while state.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def remove_stale_ipc_dirs(tmp: Path) -> int:
    """Removes the IPC directories of servers that are gone (killed before they could clean
    up: their pid file names no live process); returns how many."""
    removed = 0
    for directory in tmp.glob(f"{IPC_PREFIX}*"):
        try:
            pid = int((directory / PID_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or a server still writing it
        if not _alive(pid):
            shutil.rmtree(directory, ignore_errors=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def quiet_parse_errors() -> None:
    """aiohttp logs a traceback for every request it cannot parse: a client could flood the
    log. One line each instead (http.py answers them in the JSON shape where it can)."""
    logging.getLogger("aiohttp.server").addFilter(_OneLine())


class _OneLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.getMessage()}: {type(record.exc_info[1]).__name__}"
            record.args, record.exc_info, record.exc_text = (), None, None
        return True
