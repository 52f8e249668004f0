"""How fast the gate's load client streams on its own: against fake_sse.py's canned events, so
nothing but the client (and the fake server, on processes of its own) sets the pace.

    python -m gate.tools.load_client_bench [--concurrency 256] [--clients 4]
        [--server-processes 4] [--requests 1024] [--output-len 256] [--target 45000] [--times 5]
        [--loop auto|asyncio|uvloop]

Runs gate/run/load.py's `run_load` (the gate's client: its processes, its per-token
timestamps, its parsing) at `--concurrency` with `--clients` processes against the fake server
pacing each stream to times x target / concurrency events a second (one event a write, as the
API streams), and reports the tokens a second asked and sustained, the client's CPU per token
(its processes' CPU time from their start barrier to their last answer: start-up, prompts and
warm-up left out, as the gate's summary counts it), and the sustained rate over `--target`,
the fastest rate a gate cell asks (45k tok/s: the H200's c=256). Issue 35 asks the client to
sustain >= 4x on its cores: asked for 5x by default, since a run asked for exactly 4x can only
show less (the fake server's ramp and tail take a few percent). `--times 0`: unpaced (events
arrive back to back, several a read: a ceiling, not what a served stream looks like). Give the
server processes CPUs of their own where the host has them (taskset), or the two share and the
number is a floor.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import aiohttp

from gate.run.load import LoadSpec, run_load
from gate.run.server import free_port
from gate.tools import fake_sse
from resident import eventloop
from resident.render import OutputFormat, render
from resident.tool_args import add_format, count

READY_TIMEOUT_S = 30.0


async def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url + "/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.1)


def measure(spec: LoadSpec, server_processes: int, target: float,
            times: float) -> dict[str, Any]:
    """Runs the load against a fresh fake server pacing its streams to times x target in all
    (0: unpaced); the client's numbers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    servers = fake_sse.start(port, times * target / spec.concurrency, server_processes)
    try:
        asyncio.run(_wait_ready(url))
        result = asyncio.run(run_load(url, spec))
    finally:
        for server in servers:
            server.terminate()
            server.join(timeout=10)
    metrics = result.metrics
    tokens = metrics.total_output_tokens
    if metrics.failed or not tokens:
        raise RuntimeError(f"{metrics.failed} requests failed: {result.errors}")
    rate = metrics.output_throughput or 0.0
    return {"concurrency": spec.concurrency, "client_processes": spec.num_clients,
            "event_loop": eventloop.resolve(spec.event_loop)[0],
            "server_processes": server_processes, "tokens": tokens,
            "wall_s": metrics.duration, "tok_per_s": round(rate),
            "client_cpu_s": round(result.client_cpu_s, 2),
            "client_us_per_token": round(result.client_cpu_s / tokens * 1e6, 2),
            "itl_p50_ms": metrics.median_itl_ms, "target_tok_per_s": target,
            "asked_tok_per_s": round(times * target) if times else "unpaced",
            "times_target": round(rate / target, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=count, default=256)
    parser.add_argument("--clients", type=count, default=4, help="load client processes")
    parser.add_argument("--server-processes", type=count, default=4)
    parser.add_argument("--requests", type=count, default=1024)
    parser.add_argument("--output-len", type=count, default=256)
    parser.add_argument("--prompt-len", type=count, default=512)
    parser.add_argument("--target", type=float, default=45000.0,
                        help="the fastest rate a gate cell asks, tok/s")
    parser.add_argument("--times", type=float, default=5.0,
                        help="pace the fake server to this many times the target; 0: unpaced")
    parser.add_argument("--loop", choices=eventloop.EVENT_LOOPS, default="auto",
                        help="the client processes' event loop (auto: uvloop where installed)")
    add_format(parser)
    args = parser.parse_args(argv)
    if args.target <= 0:
        parser.error(f"--target must be > 0, got {args.target}")
    if args.times < 0:
        parser.error(f"--times must be >= 0, got {args.times}")
    try:
        spec = LoadSpec(args.concurrency, args.requests, args.prompt_len, args.output_len,
                        num_clients=args.clients, event_loop=args.loop)
    except ValueError as err:  # uvloop asked where it is missing
        parser.error(str(err))
    render({"load_client_bench": measure(spec, args.server_processes, args.target, args.times)},
           OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
