"""A long load on one server, after which everything it held must have come back (issue 37's
leak run: the prefix cache on, c=64, ten minutes).

    python -m gate.tools.soak [--model tiny] [--device cpu] [--duration 600]
        [--concurrency 64] [--prefixes 8] [--shared-prefix-len 1024] [--prompt-len 256]
        [--output-len 256] [--hang-up-every 8] [--sample-every 15] [--seed 0]
        [--set knob=value ...] [--format table|json]

Starts `resident serve MODEL` with `prefix_cache=on` and `row_check=on` (a --set overrides
either) and keeps --concurrency streams in flight for --duration seconds. The slots are split
over --prefixes groups; a group's prompts open with its own shared prefix, then 1/2 to 1x
--prompt-len tokens of their own, so the cache hits, its snapshot pool fills and replaces.
max_tokens varies by request (1/4 to 1x --output-len) so rows leave out of order, and every
--hang-up-every-th request's client hangs up after its first two tokens: an abort mid-stream.
/metrics is read every --sample-every seconds (the timeline). Then the load stops, the
requests in flight finish, and the server must hold nothing: no request running, waiting or
offloaded, no KV page or GDN slot in use, as many KV pages free as before the load (idle cached
pages count as free), the snapshot pool within its size, no failed request, no row-check
mismatch, and the cache hit at least once. The exit code is 1 when one of those is not so.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from gate.run.load import json_loads
from gate.run.server import free_port, parse_metrics
from gate.run.sse_client import sse_data
from gate.tools.api_profile import start_server, wait_ready
from resident.render import OutputFormat, render
from resident.tool_args import add_format

DEFAULT_KNOBS = ("prefix_cache=on", "row_check=on")
DRAIN_TIMEOUT_S = 120.0  # the requests in flight at the end finish within this
TOKENS_BEFORE_HANG_UP = 2
# the timeline's columns: its name -> the /metrics sample
GAUGES = {
    "running": "resident_requests_running",
    "waiting": "resident_requests_waiting",
    "offloaded": "resident_requests_offloaded",
    "kv_pages_used": "resident_kv_pages_used",
    "kv_pages_free": "resident_kv_pages_free",
    "gdn_slots_used": "resident_gdn_slots_used",
    "snapshots_used": "resident_prefix_snapshots_used",
    "pages_cached": "resident_prefix_pages_cached",
    "pages_idle": "resident_prefix_pages_idle",
}
COUNTERS = {
    "generated_tokens": "resident_generated_tokens_total",
    "hits": "resident_prefix_cache_hits_total",
    "saved_tokens": "resident_prefix_cache_saved_tokens_total",
    "snapshots_evicted": "resident_prefix_snapshots_evicted_total",
    "pages_evicted": "resident_prefix_pages_evicted_total",
    "aborts": "resident_aborts_total",
    "failed": "resident_failed_requests_total",
}


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """The JSON events of a streamed completion's SSE body (`[DONE]` and other lines skipped),
    parsed from whatever each read brings. The soak reads through aiohttp, whose responses it
    can leave mid-stream (a client hanging up); the gate's load reads with run/sse_client.py."""
    rest = b""
    async for chunk in resp.content.iter_any():
        payloads, rest = sse_data(rest, chunk)
        for payload in payloads:
            yield json_loads(payload)
    for payload in sse_data(rest, b"\n")[0]:  # a last line without its newline
        yield json_loads(payload)


@dataclass(frozen=True)
class SoakLoad:
    concurrency: int
    duration_s: float
    num_prefixes: int
    shared_prefix_len: int
    prompt_len: int
    output_len: int
    hang_up_every: int  # 0: no client hangs up
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("concurrency", "num_prefixes", "prompt_len", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("duration_s", "shared_prefix_len", "hang_up_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class ClientCounts:
    sent: int = 0
    finished: int = 0
    hung_up: int = 0
    tokens: int = 0
    errors: list[str] = field(default_factory=list)


# the timeline's columns in a table (JSON has every sample)
TIMELINE = ("running", "waiting", "kv_pages_used", "kv_pages_free", "snapshots_used",
            "pages_idle", "hits", "snapshots_evicted", "aborts")


def sample(metrics: dict[str, float]) -> dict[str, float]:
    """The timeline's columns from one /metrics reading (a missing sample: 0)."""
    return {name: metrics.get(key, 0.0) for name, key in {**GAUGES, **COUNTERS}.items()}


def leftovers(before: dict[str, float], after: dict[str, float], snapshot_pool: int,
              row_mismatches: int | None) -> list[dict[str, Any]]:
    """The end-of-soak checks, each {"check", "want", "got", "ok"}: `before` is the idle
    server's sample before the load, `after` the idle server's after it."""
    rows = [(name, 0, after[name]) for name in ("running", "waiting", "offloaded",
                                                "kv_pages_used", "gdn_slots_used")]
    rows += [("kv_pages_free", before["kv_pages_free"], after["kv_pages_free"]),
             ("failed", before["failed"], after["failed"])]
    checks = [{"check": name, "want": want, "got": got, "ok": got == want}
              for name, want, got in rows]
    checks.append({"check": "snapshots_used", "want": f"<= {snapshot_pool}",
                   "got": after["snapshots_used"], "ok": after["snapshots_used"] <= snapshot_pool})
    checks.append({"check": "hits", "want": "> 0", "got": after["hits"] - before["hits"],
                   "ok": after["hits"] > before["hits"]})
    if row_mismatches is not None:
        checks.append({"check": "row_check_mismatches", "want": 0, "got": row_mismatches,
                       "ok": row_mismatches == 0})
    return checks


def make_prefixes(load: SoakLoad, vocab: int) -> list[list[int]]:
    rng = random.Random(f"{load.seed}:prefixes")
    return [[rng.randrange(vocab) for _ in range(load.shared_prefix_len)]
            for _ in range(load.num_prefixes)]


async def _request(session: aiohttp.ClientSession, url: str, prompt: list[int],
                   max_tokens: int, hang_up: bool, counts: ClientCounts) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True}
    tokens = 0
    counts.sent += 1
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                counts.errors.append(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                return
            async for event in sse_events(resp):
                if event.get("error"):
                    counts.errors.append(str(event["error"])[:200])
                    return
                tokens += len((event.get("choices") or [{}])[0].get("token_ids", []))
                if hang_up and tokens >= TOKENS_BEFORE_HANG_UP:
                    counts.hung_up += 1
                    return  # leaving the block closes the connection: the server aborts
    except (TimeoutError, aiohttp.ClientError) as err:
        counts.errors.append(repr(err)[:200])
        return
    finally:
        counts.tokens += tokens
    if tokens != max_tokens:
        counts.errors.append(f"got {tokens} tokens, asked {max_tokens}")
    else:
        counts.finished += 1


async def drive(url: str, load: SoakLoad, vocab: int, stop: asyncio.Event) -> ClientCounts:
    """The soak's clients until `stop`; the requests in flight then finish."""
    prefixes = make_prefixes(load, vocab)
    counts = ClientCounts()
    connector = aiohttp.TCPConnector(limit=load.concurrency + 4)

    async def worker(slot: int) -> None:
        rng = random.Random(f"{load.seed}:{slot}")
        while not stop.is_set():
            own = [rng.randrange(vocab)
                   for _ in range(rng.randint(max(1, load.prompt_len // 2), load.prompt_len))]
            max_tokens = rng.randint(max(1, load.output_len // 4), load.output_len)
            hang_up = bool(load.hang_up_every) and (counts.sent + 1) % load.hang_up_every == 0
            await _request(session, url, prefixes[slot % load.num_prefixes] + own, max_tokens,
                           hang_up, counts)

    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(slot) for slot in range(load.concurrency)))
    return counts


async def read_sample(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as resp:
        return sample(parse_metrics(await resp.text()))


async def wait_idle(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The first sample with nothing running or waiting (the last one after DRAIN_TIMEOUT_S)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        now = await read_sample(session, url)
        if (now["running"] == 0 and now["waiting"] == 0) or time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.5)


async def soak(url: str, load: SoakLoad, sample_every_s: float) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async with session.get(url + "/debug/config") as resp:
            config = await resp.json()
        vocab = int(config["vocab_size"])
        before = await read_sample(session, url)
        stop = asyncio.Event()
        start = time.monotonic()
        clients = asyncio.create_task(drive(url, load, vocab, stop))
        timeline = []
        while time.monotonic() - start < load.duration_s and not clients.done():
            await asyncio.sleep(min(sample_every_s, load.duration_s))
            timeline.append({"t_s": round(time.monotonic() - start, 1),
                             **await read_sample(session, url)})
        stop.set()
        counts = await clients
        load_s = time.monotonic() - start
        after = await wait_idle(session, url)
        async with session.get(url + "/debug/rowcheck") as resp:
            rowcheck = await resp.json()
    knobs = config.get("knobs") or {}
    row_mismatches = rowcheck.get("mismatches") if knobs.get("row_check") == "on" else None
    checks = leftovers(before, after, int(knobs.get("prefix_snapshots", 0)), row_mismatches)
    checks.append({"check": "client_errors", "want": 0, "got": len(counts.errors),
                   "ok": not counts.errors})
    summary = {"load_s": round(load_s, 1), "requests_sent": counts.sent,
               "requests_finished": counts.finished, "clients_hung_up": counts.hung_up,
               "tokens_streamed": counts.tokens,
               "tok_per_s": round(counts.tokens / load_s, 1) if load_s else None,
               "row_check_steps": rowcheck.get("steps"),
               "snapshot_pool": knobs.get("prefix_snapshots"),
               "snapshot_pool_bytes": config.get("prefix_snapshot_bytes"),
               **{f"{name}_after": after[name] - before[name] for name in COUNTERS}}
    return {"soak": summary, "checks": checks, "timeline": timeline,
            "client_errors": [{"error": error} for error in counts.errors[:10]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--prefixes", type=int, default=8, help="shared prefixes (groups)")
    parser.add_argument("--shared-prefix-len", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=256,
                        help="a prompt's own tokens, at most")
    parser.add_argument("--output-len", type=int, default=256, help="max_tokens, at most")
    parser.add_argument("--hang-up-every", type=int, default=8,
                        help="every n-th request's client hangs up early (0: none)")
    parser.add_argument("--sample-every", type=float, default=15.0, help="seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", dest="knobs", action="append", default=[],
                        help="an engine knob for the server, knob=value")
    add_format(parser)
    args = parser.parse_args(argv)
    if args.sample_every <= 0:
        parser.error(f"--sample-every must be > 0, got {args.sample_every}")
    try:
        load = SoakLoad(args.concurrency, args.duration, args.prefixes, args.shared_prefix_len,
                        args.prompt_len, args.output_len, args.hang_up_every, args.seed)
    except ValueError as err:
        parser.error(str(err))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.gettempdir()) / f"resident-soak-{port}.log"
    server = start_server(args.model, args.device, port, [*DEFAULT_KNOBS, *args.knobs], 1,
                          log_path)
    try:
        asyncio.run(wait_ready(url, server))
        result = asyncio.run(soak(url, load, args.sample_every))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    output_format = OutputFormat(args.format)
    if output_format is OutputFormat.table:
        result["timeline"] = [{key: row[key] for key in ("t_s", *TIMELINE)}
                              for row in result["timeline"]]
    render(result, output_format)
    print(f"server log: {log_path}", file=sys.stderr)
    return 0 if all(check["ok"] for check in result["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
