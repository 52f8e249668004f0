"""Launching one arm's server: its own process group, pinned CPUs, a clean environment, a log.

Inherited RESIDENT_* variables are removed (and recorded), so only the gate's knobs reach an arm.
Stopping signals the whole group, so Ctrl-C or a crash of the gate leaves no server behind; a
server also dies with the gate (PR_SET_PDEATHSIG), so neither does a SIGKILLed gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gate.run.arms import Arm
from gate.run.bytecode import NO_WRITE_VARIABLE, PREFIX_VARIABLE
from resident.lifecycle import end_with_parent

HOST = "127.0.0.1"
STEP_KINDS = ("decode", "prefill", "mixed")


class ServerFailed(RuntimeError):
    """The server did not come up, or died; carries its log's tail."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(message)
        self.log_tail = log_tail


CAUSE_CHARS = 240


def failure_cause(log_tail: str) -> str:
    """What a server that exited said last, in one line: its last logged ERROR's message (the
    engine core's exception), else the last line of a CLI error box (a bad knob), else its last
    line; cut to CAUSE_CHARS. The whole tail stays in the run's record."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    cause = next((line.partition(" ERROR ")[2] for line in reversed(lines)
                  if " ERROR " in line), "")
    if not cause:
        boxed = [line.strip("│ ") for line in lines if line.startswith("│")]
        cause = " ".join(boxed) if boxed else (lines[-1] if lines else "its log is empty")
    return cause if len(cause) <= CAUSE_CHARS else cause[:CAUSE_CHARS - 3] + "..."


@dataclass(frozen=True)
class LaunchSpec:
    model: str
    device: str
    cpus: tuple[int, ...]
    inductor_cache: Path
    triton_cache: Path
    gpu: int | None
    startup_timeout_s: float
    pycache: Path | None = None  # PYTHONPYCACHEPREFIX (gate/run/bytecode.py); None: Python's own


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def clean_environment() -> tuple[dict[str, str], list[str]]:
    """os.environ without RESIDENT_* variables, and the names removed."""
    removed = sorted(k for k in os.environ if k.startswith("RESIDENT_"))
    return {k: v for k, v in os.environ.items() if k not in removed}, removed


class Server:
    def __init__(self, arm: Arm, launch: LaunchSpec, knobs: dict[str, str], log_path: Path):
        self.arm, self.launch, self.log_path = arm, launch, log_path
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        env, self.removed_env = launch_environment(arm, launch)
        if arm.kind == "resident":
            command = [sys.executable, "-m", "resident", "serve", launch.model,
                       "--device", launch.device, "--host", HOST, "--port", str(self.port)]
            command += [arg for knob, value in knobs.items() for arg in
                        ("--set", f"{knob}={value}")]
        else:
            command = shlex.split(arm.command.format(host=HOST, port=self.port))
        self.command = command
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            command, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=arm.tree,
            start_new_session=True, preexec_fn=pinned_child(set(launch.cpus), os.getpid()),
        )
        self._launched = time.monotonic()
        self.launched_at = time.time()  # the epoch, to tell servers that started together
        self.health_s: float | None = None  # launch to the first /health 200
        self.stop_s: float | None = None  # stop() to the process group gone
        self.startup: dict | None = None  # a resident core's start-up spans (/debug/config)
        self.caches: dict | None = None  # and the compile caches it used

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-chars:]

    async def wait_ready(self) -> dict:
        """Waits for /health (timing it from launch: health_s), then /v1/models; returns the
        models answer."""
        deadline = self._launched + self.launch.startup_timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            for path in ("/health", "/v1/models"):
                while True:
                    if not self.alive():
                        tail = self.log_tail()
                        raise ServerFailed(f"{self.arm.name}: server exited with code "
                                           f"{self.process.returncode} before it was ready: "
                                           f"{failure_cause(tail)}", tail)
                    if time.monotonic() > deadline:
                        raise ServerFailed(f"{self.arm.name}: not ready within "
                                           f"{self.launch.startup_timeout_s:.0f} s",
                                           self.log_tail())
                    answer = await _fetch(session, self.url + path)
                    if answer is not None:
                        break
                    await asyncio.sleep(0.05)
                if path == "/health":
                    self.health_s = round(time.monotonic() - self._launched, 3)
        return answer

    def vocab_of(self, models: dict) -> int:
        """The vocabulary size in the server's /v1/models answer (wait_ready's); ServerFailed
        when it gives none: the load's prompts are drawn below it."""
        vocab = int(models["data"][0].get("vocab_size", 0) or 0) if models.get("data") else 0
        if vocab < 1:
            raise ServerFailed(f"{self.arm.name}: /v1/models gives no vocab_size",
                               self.log_tail())
        return vocab

    async def get_json(self, path: str) -> dict | None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            return await _fetch(session, self.url + path)

    async def request_json(self, method: str, path: str, body: dict | None = None,
                           timeout_s: float = 10.0) -> tuple[int, Any]:
        """(status, the answer's JSON, {"text": ...} when it is not JSON); status 0 when the
        server did not answer."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            return await _request(session, method, self.url + path, body)

    async def post_json(self, path: str) -> dict | None:
        """POST an empty JSON body; the answer as get_json gives it."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            return await _fetch(session, self.url + path, method="POST")

    async def metrics(self) -> dict[str, float]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            try:
                async with session.get(self.url + "/metrics") as resp:
                    text = await resp.text() if resp.status == 200 else ""
            except aiohttp.ClientError:
                return {}
        return parse_metrics(text)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to the whole process group, then SIGKILL; times it (stop_s)."""
        started = time.monotonic()
        if self.alive():
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        self._kill_group()
        self._log.close()
        self.stop_s = round(time.monotonic() - started, 3)

    def _kill_group(self) -> None:
        """The API process exits on SIGTERM; make sure nothing of its group lingers."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


def tensor_parallel_ranks(arm: Arm) -> int:
    """The GPUs an arm's server needs: its `tensor_parallel` knob (1 when unset)."""
    return int(arm.knobs.get("tensor_parallel", 1))


def visible_gpus(gpu: int, ranks: int) -> str:
    """CUDA_VISIBLE_DEVICES for a server of `ranks` tensor-parallel ranks from GPU `gpu` on:
    rank r takes the r-th visible one (resident/parallel/group.py)."""
    return ",".join(str(gpu + rank) for rank in range(ranks))


def launch_environment(arm: Arm, launch: LaunchSpec) -> tuple[dict[str, str], list[str]]:
    """(the environment an arm's process runs in, the RESIDENT_* names removed from ours): the
    launch's compile caches, bytecode cache and GPUs (as many from the placement's on as the
    arm's tensor_parallel knob asks), unbuffered output, and for a resident arm its tree first on
    PYTHONPATH. The server gets it, and gate/tools/served_ratio.py's in-process run of the
    same engine."""
    env, removed = clean_environment()
    env["TORCHINDUCTOR_CACHE_DIR"] = str(launch.inductor_cache)
    env["TRITON_CACHE_DIR"] = str(launch.triton_cache)
    if launch.pycache is not None:
        env[PREFIX_VARIABLE] = str(launch.pycache)
        env.pop(NO_WRITE_VARIABLE, None)
    env["PYTHONUNBUFFERED"] = "1"
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the same GPU index as NVML's
    if launch.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_gpus(launch.gpu, tensor_parallel_ranks(arm))
    if arm.kind == "resident":
        put_tree_first(env, arm)
    return env, removed


def put_tree_first(env: dict[str, str], arm: Arm) -> None:
    """A resident arm's tree first on `env`'s PYTHONPATH: its process imports that tree's
    `resident`, whatever the gate's own is."""
    env["PYTHONPATH"] = os.pathsep.join([str(arm.tree), *filter(None, [env.get("PYTHONPATH")])])


def pinned_child(cpus: set[int], gate_pid: int):
    """What an arm's process (its server, or served_ratio's in-process run) does before exec:
    SIGTERM when the gate dies (its own session would otherwise outlive a SIGKILLed gate,
    holding the GPU and the port), exit at once if the gate is already gone, and pin to
    `cpus`."""
    def setup() -> None:
        end_with_parent(gate_pid, signal.SIGTERM)
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


async def _request(session: aiohttp.ClientSession, method: str, url: str,
                   body: dict | None = None) -> tuple[int, Any]:
    """(status, the answer's JSON, {"text": ...} when it is not JSON); status 0 and an error
    message when the server did not answer."""
    try:
        async with session.request(method, url, json=body) as resp:
            status, text = resp.status, await resp.text()
    except (aiohttp.ClientError, TimeoutError) as err:
        return 0, {"error": {"message": f"no answer: {err!r}"}}
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, {"text": text}


async def _fetch(session: aiohttp.ClientSession, url: str, method: str = "GET") -> dict | None:
    """The answer's JSON ({"text": ...} when it is not JSON), or None unless it is a 200."""
    status, answer = await _request(session, method, url, {} if method == "POST" else None)
    return answer if status == 200 else None


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> samples by name, labels kept in the name
    (e.g. 'resident_steps_total{kind="decode"}')."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                samples[name] = float(value)
            except ValueError:
                continue
    return samples


# the requests late launch's windows took (resident's /metrics, late_launch)
WINDOW_ARRIVALS = "resident_window_arrivals_total"


def counter_delta(before: dict[str, float], after: dict[str, float], name: str) -> int | None:
    """A /metrics counter's growth between two readings; None for a server without it."""
    return int(after[name] - before.get(name, 0.0)) if name in after else None


# the engine core's garbage collector pauses in resident's /metrics, a sample a generation
GC_PAUSE_SECONDS = "resident_gc_pause_seconds_total"


def gc_pause_s(before: dict[str, float], after: dict[str, float]) -> float | None:
    """The engine core's garbage collector pauses between two readings, every generation
    summed; None for a server without the counters."""
    names = [name for name in after if name.startswith(GC_PAUSE_SECONDS + "{")]
    if not names:
        return None
    return round(sum(after[name] - before.get(name, 0.0) for name in names), 6)


# the prefix cache's counters in resident's /metrics, by the key a run record keeps them under
PREFIX_COUNTERS = {"hits": "resident_prefix_cache_hits_total",
                   "saved_tokens": "resident_prefix_cache_saved_tokens_total"}


def prefix_counts(before: dict[str, float], after: dict[str, float],
                  names: dict[str, str] = PREFIX_COUNTERS) -> dict[str, int]:
    """The prefix cache's hits and restored prompt tokens between two readings of its
    counters, /metrics by default (`names`: each key's counter; empty for a server that has no
    such counters)."""
    deltas = {key: counter_delta(before, after, name) for key, name in names.items()}
    return {key: delta for key, delta in deltas.items() if delta is not None}


# the server's TTFT parts in resident's /metrics (its latency histograms), by the key a
# run record keeps their means under: names of the metrics protocol, read over HTTP from any
# tree's server (the gate imports no server code; a test holds them among
# resident/server/metrics.py's LATENCY_METRICS)
CORE_LATENCIES = {"queue": "resident_request_queue_seconds",
                  "prefill": "resident_request_prefill_seconds",
                  "ttft": "resident_time_to_first_token_seconds"}


def core_latency_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The server's mean queue, prefill and TTFT ms (latency.py) over the requests whose first
    token left its engine core between two readings of /metrics (empty for a server without
    the histograms, or no such request)."""
    means = {}
    for key, name in CORE_LATENCIES.items():
        count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        if count > 0:
            total = after[f"{name}_sum"] - before.get(f"{name}_sum", 0.0)
            means[key] = round(1e3 * total / count, 3)
    return means


@dataclass(frozen=True)
class EngineSteps:
    """resident's step counters by kind, from its /metrics (empty for other servers)."""

    counts: dict[str, int]
    seconds: dict[str, float]  # wall time inside the engine's steps

    @classmethod
    def parse(cls, metrics: dict[str, float]) -> EngineSteps:
        def by_kind(name: str) -> dict[str, float]:
            return {kind: metrics[f'{name}{{kind="{kind}"}}'] for kind in STEP_KINDS
                    if f'{name}{{kind="{kind}"}}' in metrics}
        return cls({k: int(v) for k, v in by_kind("resident_steps_total").items()},
                   by_kind("resident_step_seconds_total"))

    def since(self, before: EngineSteps) -> tuple[dict[str, int], dict[str, float]]:
        """(steps by kind, mean ms a step by kind) between `before` and this reading."""
        steps = {k: n - before.counts.get(k, 0) for k, n in self.counts.items()}
        step_ms = {k: round(1e3 * (s - before.seconds.get(k, 0.0)) / steps[k], 3)
                   for k, s in self.seconds.items() if steps.get(k)}
        return steps, step_ms
