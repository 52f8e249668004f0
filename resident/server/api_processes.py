"""The API processes after the first: `resident serve --api-processes N` runs N processes on one
port (SO_REUSEPORT: the kernel spreads new connections over them), each with its own pipes to
the engine core, which sends each request's outputs to the process that added it (routing.py).

The first process (the one `serve` started) spawns the core and these, watches them and on
SIGTERM passes it on; each drains its own requests as the first does. One that dies fails only
its own streams (its clients' connections close with it): the first tells the core, which
aborts its requests, and the others serve on (new connections go to the live ones). Each
process sees the core fail or stall itself, fails its streams and exits. With `api_core` set
they all run on its CPUs. Prometheus counters
are kept in multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`, set before any process imports
prometheus_client), so /metrics in any process sums all of them.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from resident import eventloop
from resident.server.protocol import IPC_PREFIX, PID_FILE

if TYPE_CHECKING:
    from resident.server.connections import ConnectionLimits
    from resident.server.serve import ServeOptions

log = logging.getLogger("resident.serve")
SEQS_PER_API_PROCESS = 128  # one API process streams ~25k tok/s (issue 35): ~c=128 on the H200
CPUS_PER_API_PROCESS = 4  # leave the core and the load its CPUs
MAX_AUTO_API_PROCESSES = 4
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def auto_api_processes(num_cpus: int, max_num_seqs: int, num_api_cpus: int = 0) -> int:
    """--api-processes 0: one a SEQS_PER_API_PROCESS sequences the engine may run, at most one
    a CPUS_PER_API_PROCESS CPUs the server may use (or, with api_core set, one an API CPU), at
    most MAX_AUTO_API_PROCESSES; at least 1."""
    by_load = -(-max_num_seqs // SEQS_PER_API_PROCESS)
    by_cpus = num_api_cpus or num_cpus // CPUS_PER_API_PROCESS
    return max(1, min(MAX_AUTO_API_PROCESSES, by_cpus, by_load))


def share_metrics() -> Path:
    """Puts Prometheus in multiprocess mode for this process and the ones it spawns: a fresh
    directory in `PROMETHEUS_MULTIPROC_DIR` (removed by serve.py at exit; one a killed server
    left is removed as its IPC directories are: it holds the server's pid file)."""
    directory = Path(tempfile.mkdtemp(prefix=f"{IPC_PREFIX}metrics-"))
    (directory / PID_FILE).write_text(str(os.getpid()))
    os.environ[METRICS_DIR_ENV] = str(directory)
    return directory


class ApiProcesses:
    """The API processes 1..N-1, spawned at construction."""

    def __init__(self, options: ServeOptions, ipc_dir: Path, core_pid: int,
                 limits: ConnectionLimits) -> None:
        context = multiprocessing.get_context("spawn")
        self._processes = {
            api_index: context.Process(
                target=run_api_process, name=f"resident-api-{api_index}", daemon=True,
                args=(options, api_index, ipc_dir, core_pid, limits))
            for api_index in range(1, options.api_processes)}
        self._dead: set[int] = set()
        self._stopping = False
        for api_index, process in self._processes.items():
            process.start()
            log.info("API process %d started (pid %d)", api_index, process.pid)

    def newly_dead(self) -> list[int]:
        """The processes that exited since the last call, each logged once."""
        dead = [i for i, p in self._processes.items() if i not in self._dead and not p.is_alive()]
        for api_index in dead:
            self._dead.add(api_index)
            if not self._stopping:
                log.error("API process %d exited with code %s: its streams failed; %d API "
                          "processes serve on", api_index, self._processes[api_index].exitcode,
                          len(self._processes) + 1 - len(self._dead))
        return dead

    def stop(self) -> None:
        """SIGTERM to each: it drains its requests and exits."""
        self._stopping = True
        for process in self._processes.values():
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    def join(self, timeout_s: float) -> None:
        """Waits up to timeout_s for every process to exit, then kills the rest."""
        self._stopping = True
        deadline = time.monotonic() + timeout_s
        for process in self._processes.values():
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()


def run_api_process(options: ServeOptions, api_index: int, ipc_dir: Path, core_pid: int,
                    limits: ConnectionLimits) -> None:
    """Process entry point of API process `api_index` (>= 1)."""
    from resident.config import parse_cpu_list
    from resident.lifecycle import die_with_spawner
    from resident.server.connections import bind
    from resident.server.serve import SiblingCore, quiet_parse_errors, serve_api

    logging.basicConfig(level=options.log_level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    quiet_parse_errors()
    die_with_spawner()
    api_cpus = parse_cpu_list(options.engine_config.api_core, "api_core")
    if api_cpus:  # the API processes share api_core's CPUs
        os.sched_setaffinity(0, api_cpus)
    sock = bind(options.host, options.port, reuse_port=True)
    sys.exit(eventloop.run(serve_api(options, sock, limits, api_index, ipc_dir,
                                     SiblingCore(core_pid)), options.engine_config.event_loop))
