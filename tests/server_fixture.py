"""A real `resident serve` subprocess on a free loopback port, and small HTTP helpers for tests."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from gate.run.server import parse_metrics
from resident import eventloop

ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 120
# the event loops this host can run: asyncio's, and uvloop where it is installed
HOST_LOOPS = sorted({"asyncio", eventloop.resolve("auto")[0]})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """Starts `python -m resident serve MODEL --device DEVICE` and waits for /health."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, model: str = "tiny",
                 device: str = "cpu", fd_limit: int | None = None):
        """`fd_limit`: the server's RLIMIT_NOFILE (soft and hard), for tests of its limits."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("RESIDENT_")}
        # this tree first, then what the caller's path adds (the GPU host's wheels in /tmp/site)
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        child_env.update(PYTHONPATH=os.pathsep.join([str(ROOT), *inherited]), **(env or {}))
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"resident-{self.port}.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "resident", "serve", model, "--device", device,
             "--port", str(self.port), *args],
            env=child_env, stdout=self._log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_pytest if fd_limit is None else lambda: _limited(fd_limit),
        )

    def wait_ready(self, headers: dict[str, str] | None = None,
                   timeout_s: float = STARTUP_TIMEOUT_S) -> Server:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited {self.process.returncode}:\n{self.log()}")
            try:
                status, _ = run(get(self.url + "/health", headers))
                if status == 200:
                    return self
            except aiohttp.ClientError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"server not ready in {timeout_s:g}s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def core_pid(self) -> int:
        """The engine-core process, as the server logged it (with several API processes it is
        not the server's only spawned child)."""
        found = re.search(r"engine core started \(pid (\d+)\)", self.log())
        if found is None:
            raise RuntimeError(f"no engine core in the log of {self.process.pid}")
        return int(found.group(1))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


def children(pid: int) -> list[int]:
    """The live child processes of pid."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _die_with_pytest() -> None:
    """A server outlives nothing: SIGTERM when the test process dies (prctl PDEATHSIG), so a
    killed test run leaves no server behind."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _limited(fd_limit: int) -> None:
    _die_with_pytest()
    resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))


def run(coro):
    return asyncio.run(coro)


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, object]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except json.JSONDecodeError:
            return resp.status, text


async def post(url: str, body, headers: dict[str, str] | None = None) -> tuple[int, object]:
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    async with aiohttp.ClientSession() as session, session.post(
            url, data=data, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def stream(session: aiohttp.ClientSession, url: str, body: dict,
                 stop_after: int | None = None) -> list[dict]:
    """Streams a completion; returns its SSE events ([DONE] excluded). With `stop_after`, the
    client hangs up after that many events."""
    events = []
    async with session.post(url + "/v1/completions", json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            events.append(json.loads(line[len("data: "):]))
            if stop_after is not None and len(events) >= stop_after:
                break
    return events


async def metrics(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    """Prometheus samples by name (labels kept in the name), e.g. 'resident_kv_pages_free'."""
    _, text = await get(url + "/metrics", headers)
    return parse_metrics(str(text))


async def idle_metrics(url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """The metrics once no request runs or waits (an aborted one leaves after the step planned
    ahead of its abort), or after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = await metrics(url)
        idle = samples["resident_requests_running"] == 0 == samples["resident_requests_waiting"]
        if idle or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(0.1)


def stop_across_tokens(texts: list[str]) -> tuple[str, str, int]:
    """For a completion whose tokens' texts (one a streamed event) are `texts`: a 2-character
    stop string that spans the boundary of two tokens' text and occurs nowhere before, the text
    before it, and how many tokens it takes to see it whole."""
    text = "".join(texts)
    end = 0
    for j in range(len(texts) - 1):
        end += len(texts[j])
        stop = text[end - 1:end + 1]
        if len(texts[j]) >= 2 and len(texts[j + 1]) >= 2 and text.find(stop) == end - 1:
            return stop, text[:end - 1], j + 2
    raise AssertionError(f"no token boundary to put a stop string on in {text!r}")


async def sse_events(session: aiohttp.ClientSession, url: str, body: dict) -> list[dict]:
    """POSTs `body` (which streams) and returns its SSE events, [DONE] excluded."""
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return [json.loads(raw[len(b"data: "):]) async for raw in resp.content
                if raw.startswith(b"data: {")]
