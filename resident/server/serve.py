"""`resident serve`: the API process, which spawns the engine-core process and serves HTTP.

The API process never imports torch. It binds the IPC pipes, spawns the core, answers /health
with 503 until the core says Ready, and exits non-zero if the core fails or dies, so whoever
launched the server (a gate, a test) sees it go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from resident.config import EngineConfig, parse_cpu_list
from resident.model.config import ModelConfig
from resident.server.api import create_app, run_api
from resident.server.client import EngineClient
from resident.server.core import run_engine_core
from resident.server.tokenizer import load_tokenizer

log = logging.getLogger("resident.serve")
LIVENESS_POLL_S = 0.5


@dataclass(frozen=True)
class ServeOptions:
    model_config: ModelConfig
    engine_config: EngineConfig  # resolved for the device
    device: str  # cpu | cuda
    host: str
    port: int
    api_key: str | None
    log_level: str


def serve(options: ServeOptions) -> int:
    """Runs the server until SIGINT/SIGTERM (exit 0) or an engine failure (exit 1)."""
    logging.basicConfig(level=options.log_level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(_serve(options))


async def _serve(options: ServeOptions) -> int:
    with tempfile.TemporaryDirectory(prefix="resident-ipc-") as ipc_dir:
        client = EngineClient(f"ipc://{ipc_dir}/requests", f"ipc://{ipc_dir}/outputs")
        core = _spawn_core(options, ipc_dir)
        # pinned only after the spawn: the core must not inherit the API's one CPU
        api_cpus = parse_cpu_list(options.engine_config.api_core, "api_core")
        if api_cpus:
            os.sched_setaffinity(0, api_cpus)
        client.start()
        model_dir = options.model_config.weights
        tokenizer = load_tokenizer(model_dir if Path(model_dir).is_dir() else None,
                                   options.model_config.vocab_size)
        app = create_app(client, tokenizer, options.model_config.name, options.api_key)
        runner = await run_api(app, options.host, options.port)
        try:
            return await _until_stopped(client, core)
        finally:
            await runner.cleanup()
            await client.close()
            core.join(timeout=10)
            if core.is_alive():
                core.kill()


def _spawn_core(options: ServeOptions, ipc_dir: str) -> multiprocessing.Process:
    context = multiprocessing.get_context("spawn")
    core = context.Process(
        target=run_engine_core, name="resident-core", daemon=True,
        args=(options.model_config, options.engine_config, options.device,
              f"ipc://{ipc_dir}/requests", f"ipc://{ipc_dir}/outputs", options.log_level),
    )
    core.start()
    log.info("engine core started (pid %d)", core.pid)
    return core


async def _until_stopped(client: EngineClient, core: multiprocessing.Process) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ready = asyncio.ensure_future(client.wait_ready())
    while not stop.is_set():
        if ready.done() and ready.exception() is None:
            log.info("ready: planning mode %s (%s)", client.info.get("planning_mode"),
                     client.info.get("planning_reason"))
            ready = asyncio.get_running_loop().create_future()  # log once
        if client.fatal is not None:
            log.error("engine core failed; the server exits")
            return 1
        if not core.is_alive():
            log.error("engine core exited with code %s; the server exits", core.exitcode)
            return 1
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), LIVENESS_POLL_S)
    return 0
