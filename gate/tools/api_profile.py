"""Where the API process's CPU goes per streamed token (the tiny model on the CPU by default).

    python -m gate.tools.api_profile [--model tiny] [--device cpu] [--concurrency 64]
        [--requests 128] [--prompt-len 16] [--output-len 128] [--api-processes 1]
        [--py-spy stacks.txt [--native] [--spy core]] [--top 25] [--set knob=value ...]
        [--temperature 0 --top-p 1] [--synthetic-decode [--step-ms 0]]

Starts `resident serve MODEL --device DEVICE`, drives it with the gate's load client
(gate/run/load.py: streamed completions at a fixed concurrency, ignore_eos, after a warm-up at
the same concurrency), and reads the API process's CPU time (utime + stime, from /proc) before
and after the measured requests: µs of API CPU per streamed token (all API processes together;
`busiest_api_cores`: the busiest one's share of a core). With --py-spy (py-spy
installed: `pip install py-spy`) py-spy samples the API process during the measured requests
only (start-up and warm-up left out) into that file (collapsed stacks) and the tool prints the
functions with the most own samples, as µs per token: their share of the samples times the
measured µs per token. With --native py-spy also walks the C frames (the system calls under a
write: libc `send` took 49% of the API's samples at c=64 on the project's VM); it must then stop
the process for each sample, so the run is slower and the CPU figures a little high. With
--spy core py-spy samples the engine core instead, and its top reads in the core's µs a token
(`core_us_per_token`): where a served step's host time goes, the CUDA driver's calls included
with --native. --temperature / --top-p make every request sample (0: greedy).
`api_us_per_request` is the same CPU per measured request: with --output-len 1 and a long
--prompt-len, what taking in a request costs the API (resident/tools/intake_bench.py times its
parts).

With --synthetic-decode the server's engine core skips the decode forward
(resident/tools/synthetic_core.py; each decode step sleeps --step-ms instead): on this host's
tiny CPU model the API process then streams tens of thousands of tokens a second, as on the
H200, so its cost a token can be measured and changed without a GPU. `core_cores` says how busy
the core was (near 1.00 with --step-ms 0: the core's host work, not the API, paced the run).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from gate.run.load import LoadSpec, run_load, warm_up
from gate.run.server import free_port
from gate.run.telemetry import read_stat
from resident.render import OutputFormat, render
from resident.tool_args import add_draw, add_format, count

STARTUP_TIMEOUT_S = 900.0  # a CUDA server compiles and captures its graphs first
PROMPT_LEN = 16


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU seconds so far."""
    return sum(user_system_seconds(pid))


def user_system_seconds(pid: int) -> tuple[float, float]:
    """The process's user and system CPU seconds so far; a process gone fails naming it."""
    stat = read_stat(pid)
    if stat is None:
        raise RuntimeError(f"process {pid} is gone: its CPU cannot be read")
    return stat[1], stat[2]


def start_server(model: str, device: str, port: int, knobs: list[str], api_processes: int,
                 log_path: Path, step_ms: float | None = None) -> subprocess.Popen:
    """`resident serve`, or with `step_ms` (not None) the synthetic-decode server."""
    sets = [arg for knob in knobs for arg in ("--set", knob)]
    serve = (["-m", "resident", "serve"] if step_ms is None
             else ["-m", "resident.tools.synthetic_core", "--step-ms", str(step_ms)])
    return subprocess.Popen(
        [sys.executable, *serve, model, "--device", device, "--port",
         str(port), "--api-processes", str(api_processes), *sets],
        stdout=log_path.open("w"), stderr=subprocess.STDOUT)


def api_pids(server_pid: int, log_path: Path) -> list[int]:
    """The API processes: the server's, then those it logged starting."""
    found = re.findall(r"API process \d+ started \(pid (\d+)\)", log_path.read_text())
    return [server_pid, *map(int, found)]


async def wait_ready(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited {server.returncode} before it was ready")
            try:
                async with session.get(url + "/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.3)
    raise RuntimeError(f"the server was not ready in {STARTUP_TIMEOUT_S:g} s")


def core_pid(log_path: Path) -> int:
    """The engine core's pid, from the server's log."""
    return int(re.findall(r"engine core started \(pid (\d+)\)", log_path.read_text())[0])


async def measure(url: str, pids: list[int], core: int, spec: LoadSpec,
                  stacks: Path | None, native: bool = False,
                  spied: str = "api") -> dict[str, Any]:
    """Runs the load; the API processes' and the core's CPU over the measured requests (py-spy
    samples the first API process, or with `spied` "core" the engine core)."""
    pid = pids[0] if spied == "api" else core
    await warm_up(url, spec)
    sampler = None
    if stacks is not None:
        # --nonblocking: py-spy never stops the process; native frames need it stopped
        how = ["--native", "--rate", "200"] if native else ["--nonblocking", "--rate", "500"]
        sampler = subprocess.Popen(["py-spy", "record", "--pid", str(pid), *how,
                                    "--format", "raw", "--output", str(stacks)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1.0)  # py-spy attaches
    before = [user_system_seconds(p) for p in pids]
    core_before = cpu_seconds(core)
    # warmed above: run_load would warm again inside the window, its CPU on measured tokens
    result = await run_load(url, dataclasses.replace(spec, num_warmup=0))
    after = [user_system_seconds(p) for p in pids]
    each_s = [sum(a) - sum(b) for a, b in zip(after, before, strict=True)]
    system_s = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    core_s = cpu_seconds(core) - core_before
    api_s = sum(each_s)
    if sampler is not None:
        sampler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        sampler.wait(timeout=60)
    metrics = result.metrics
    tokens = metrics.total_output_tokens
    if not tokens:
        raise RuntimeError(f"no tokens streamed: {result.errors}")
    return {"concurrency": spec.concurrency, "requests_ok": metrics.completed,
            "failed": metrics.failed, "tokens": tokens,
            "wall_s": metrics.duration, "tok_per_s": metrics.output_throughput,
            "api_processes": len(pids), "api_cpu_s": round(api_s, 3),
            "api_cores": round(api_s / metrics.duration, 3),
            "busiest_api_cores": round(max(each_s) / metrics.duration, 3),
            "api_us_per_token": round(api_s / tokens * 1e6, 2),
            # the kernel's part: mostly each stream's send (on loopback also the client's
            # receive path and wake-up), which no change in Python removes
            "api_system_share": round(system_s / api_s, 3) if api_s else 0.0,
            "api_us_per_request": round(api_s / max(metrics.completed, 1) * 1e6, 1),
            "core_cores": round(core_s / metrics.duration, 3),
            "core_us_per_token": round(core_s / tokens * 1e6, 2)}


def top_functions(stacks: Path, us_per_token: float, top: int) -> list[dict[str, Any]]:
    """The `top` functions by own samples in py-spy's collapsed stacks ("frame;frame count"
    lines), each as its share of all samples and that share of `us_per_token`."""
    own: dict[str, int] = {}
    for line in stacks.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            name, _, where = frames.rsplit(";", 1)[-1].partition(" (")
            leaf = f"{name} ({where.rsplit(':', 1)[0]})"  # the function, its lines together
            own[leaf] = own.get(leaf, 0) + int(count)
    total = sum(own.values()) or 1
    rows = [{"function": leaf, "share": round(n / total, 4),
             "own_us_per_token": round(n / total * us_per_token, 2)}
            for leaf, n in sorted(own.items(), key=lambda item: -item[1])[:top]]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--api-processes", type=int, default=1,
                        help="resident serve --api-processes (0: its default)")
    parser.add_argument("--concurrency", type=count, default=64)
    parser.add_argument("--requests", type=count, default=128)
    parser.add_argument("--prompt-len", type=count, default=PROMPT_LEN)
    parser.add_argument("--output-len", type=count, default=128)
    parser.add_argument("--py-spy", dest="stacks", type=Path, default=None,
                        help="sample the API process with py-spy into this file; print its top")
    parser.add_argument("--native", action="store_true",
                        help="with --py-spy: C frames too (stops the process for each sample)")
    parser.add_argument("--spy", choices=("api", "core"), default="api",
                        help="with --py-spy: the process sampled (core: the engine core)")
    add_draw(parser)
    parser.add_argument("--top", type=count, default=25)
    parser.add_argument("--set", dest="knobs", action="append", default=[],
                        help="an engine knob for the server, knob=value")
    parser.add_argument("--synthetic-decode", action="store_true",
                        help="the engine core skips the decode forward (synthetic_core.py)")
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="with --synthetic-decode: each decode step's sleep, ms")
    add_format(parser)
    args = parser.parse_args(argv)
    if args.step_ms < 0 or (args.step_ms and not args.synthetic_decode):
        parser.error(f"--step-ms must be >= 0 and needs --synthetic-decode, got {args.step_ms}")
    if (args.native or args.spy != "api") and not args.stacks:
        parser.error("--native and --spy go with --py-spy")
    try:
        spec = LoadSpec(args.concurrency, args.requests, args.prompt_len, args.output_len,
                        num_warmup=min(args.concurrency, args.requests),
                        temperature=args.temperature, top_p=args.top_p)
    except ValueError as error:
        parser.error(str(error))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.gettempdir()) / f"resident-api-profile-{port}.log"
    server = start_server(args.model, args.device, port, args.knobs, args.api_processes,
                          log_path, args.step_ms if args.synthetic_decode else None)
    try:
        asyncio.run(wait_ready(url, server))
        result = asyncio.run(measure(url, api_pids(server.pid, log_path), core_pid(log_path),
                                     spec, args.stacks, args.native, args.spy))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    sections: dict[str, Any] = {"api_profile": result}
    if args.stacks:
        sections["top_functions"] = top_functions(args.stacks,
                                                  result[f"{args.spy}_us_per_token"], args.top)
    render(sections, OutputFormat(args.format))
    print(f"server log: {log_path}", file=sys.stderr)  # stdout holds the results alone
    return 0


if __name__ == "__main__":
    sys.exit(main())
