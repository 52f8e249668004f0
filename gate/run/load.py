"""Load: fixed-concurrency streaming completions against an OpenAI-compatible server.

Prompts are random token ids below the server's vocabulary, seeded, so no prefix cache helps and
two arms given one seed see the same prompts; with `shared_prefix_len` every prompt of a run
(warm-up too) opens with one shared prefix of that many tokens, seeded alike, then its own
`prompt_len`, so a cell measures what a prefix cache buys. Every request asks for exactly
`output_len` tokens (ignore_eos), sampled as the spec says (greedy by default; sampled requests
bring no seed). Warm-up requests run first at the same concurrency and are left out.

Requests arrive in a closed loop by default: each of `concurrency` slots sends its next request
as its last one ends, so equal output lengths send them in waves. With `request_rate` they arrive
open loop, as `vllm bench serve --request-rate --max-concurrency` sends them: a Poisson process
at that rate (seeded like the prompts), each on a free slot, at most `concurrency` in flight; a
request that finds every slot busy waits for one, is counted (`RunResult.num_waited`), and its
TTFT counts from its send, as vLLM's does. A run's
numbers are a ServeMetrics, named as `vllm bench serve --save-result` names them:
output_throughput (output tok/s) = output tokens of the measured requests over the measured wall
time; TTFT, TPOT, ITL and E2EL as ServeMetrics says. Failed requests are counted and kept out of
the distributions.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import os
import queue
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

try:  # 1 µs an event against the stdlib's 5: the client parses one a streamed token
    from orjson import dumps as json_dumps
    from orjson import loads as json_loads
except ImportError:  # a host without it (the H200's, unless .whl/ carries the wheel)
    from json import loads as json_loads

    def json_dumps(obj) -> bytes:
        return json.dumps(obj).encode()

from gate.metrics import LATENCIES, ServeMetrics, latency_fields
from gate.run.sse_client import SseClient
from resident import eventloop
from resident.lifecycle import end_with_parent


@dataclass(frozen=True)
class LoadSpec:
    concurrency: int
    num_requests: int
    prompt_len: int = 512  # each prompt's own tokens
    output_len: int = 256
    vocab_size: int = 512
    shared_prefix_len: int = 0  # tokens of the one prefix every prompt opens with
    seed: int = 0
    num_warmup: int = 0
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = 3600.0
    num_clients: int = 1  # processes the measured requests' slots are split over
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    # the run's number in its cell: with the concurrency it keys the prompts' own tokens, so no
    # run repeats another's prompts (a prefix cache would serve a repeat as a whole-prompt hit)
    run: int = 0
    request_rate: float = 0.0  # measured requests a second, open loop; 0: a closed loop
    # the client processes' asyncio loop (resident/eventloop.py): auto is uvloop where installed
    event_loop: str = "auto"

    def __post_init__(self) -> None:
        for name in ("concurrency", "num_requests", "prompt_len", "output_len", "vocab_size",
                     "num_clients"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_warmup < 0:
            raise ValueError(f"num_warmup must be >= 0, got {self.num_warmup}")
        if self.shared_prefix_len < 0:
            raise ValueError(f"shared_prefix_len must be >= 0, got {self.shared_prefix_len}")
        if not 0 <= self.request_rate < float("inf"):
            raise ValueError(f"request_rate must be >= 0 and finite, got {self.request_rate}")
        eventloop.resolve(self.event_loop)

    @property
    def total_prompt_len(self) -> int:
        """Tokens a prompt holds: the shared prefix and its own."""
        return self.shared_prefix_len + self.prompt_len


@dataclass
class RequestResult:
    ok: bool
    output_tokens: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    latency_s: float | None = None  # request sent to its last token
    error: str | None = None
    waited: bool = False  # open loop: it arrived with every slot busy


BARRIER_TIMEOUT_S = 120.0  # client processes wait this long for each other to be ready


@dataclass(frozen=True)
class RunResult:
    metrics: ServeMetrics
    errors: tuple[str, ...] = ()
    # CPU seconds the client spent sending the measured requests and reading their streams: its
    # event loop's thread, or the sum over its processes (warm-up and process start-up left out)
    client_cpu_s: float = 0.0
    num_waited: int = 0  # open loop: measured requests that arrived with every slot busy


def make_prompts(spec: LoadSpec, count: int, salt: int) -> list[list[int]]:
    """`count` prompts: the run's shared prefix (the same for every salt, cell and run of a
    seed), then `prompt_len` tokens of each prompt's own (their own for each salt, concurrency
    and run: arms measured on the same seed get the same prompts)."""
    shared_rng = random.Random(f"{spec.seed}:shared")
    shared = [shared_rng.randrange(spec.vocab_size) for _ in range(spec.shared_prefix_len)]
    rng = random.Random(f"{spec.seed}:{salt}:c{spec.concurrency}:r{spec.run}")
    return [shared + [rng.randrange(spec.vocab_size) for _ in range(spec.prompt_len)]
            for _ in range(count)]


def num_warmup_for(concurrency: int, shared_prefix_len: int) -> int:
    """A cell's warm-up requests: one a slot, and with a shared prefix a second wave: the
    prefix cache snapshots a prefix where the second request sharing it leaves the first one's
    cached pages (resident/engine/prefix.py), so only then do the measured requests restore it
    as in a warm server."""
    return concurrency * (2 if shared_prefix_len else 1)


def warmup_prompts(spec: LoadSpec) -> list[list[int]]:
    """The prompts of a run's warm-up requests (salt 1): `spec.num_warmup` of them."""
    return make_prompts(spec, spec.num_warmup, salt=1)


def measured_prompts(spec: LoadSpec) -> list[list[int]]:
    """The prompts of a run's measured requests (salt 2), in the order one client sends them:
    what an in-process run of the same load (gate/tools/served_ratio.py) gives the engine."""
    return make_prompts(spec, spec.num_requests, salt=2)


def arrival_offsets(spec: LoadSpec, count: int) -> list[float] | None:
    """Open loop (`request_rate`): when each of `count` measured requests is sent, seconds
    after the run's start, the first at 0 and then exponential gaps (a Poisson process), seeded
    as the prompts are, so arms on one seed see the same arrivals; None for a closed loop."""
    if not spec.request_rate:
        return None
    rng = random.Random(f"{spec.seed}:arrivals:c{spec.concurrency}:r{spec.run}")
    offsets, at = [], 0.0
    for _ in range(count):
        offsets.append(at)
        at += rng.expovariate(spec.request_rate)
    return offsets


def _body(spec: LoadSpec, prompt: list[int]) -> bytes:
    body = {"prompt": prompt, "max_tokens": spec.output_len, "ignore_eos": True,
            "temperature": spec.temperature, "stream": True}
    if spec.top_p < 1:
        body["top_p"] = spec.top_p
    if spec.top_k:
        body["top_k"] = spec.top_k
    if spec.model:
        body["model"] = spec.model
    return json_dumps(body)


async def _one(client: SseClient, slot: int, spec: LoadSpec,
               prompt: list[int]) -> RequestResult:
    """One streamed completion on slot `slot`'s connection: each token stamped with the
    arrival of the read that brought it."""
    stamps: list[float] = []
    errors: list[str] = []

    def on_event(payload: bytes, now: float) -> None:
        event = json_loads(payload)
        if event.get("error"):
            errors.append(str(event["error"]))
        stamps.extend([now] * len((event.get("choices") or [{}])[0].get("token_ids", ())))

    start = time.perf_counter()
    try:
        async with asyncio.timeout(spec.timeout_s):
            status, text = await client.post(slot, "/v1/completions", _body(spec, prompt),
                                             on_event)
    except (TimeoutError, OSError, ValueError) as err:  # HttpError is an OSError
        return RequestResult(False, error=repr(err))
    if status != 200:
        return RequestResult(False, error=f"HTTP {status}: {text.decode(errors='replace')}")
    if errors:
        return RequestResult(False, len(stamps), error=errors[0])
    if len(stamps) != spec.output_len:
        return RequestResult(False, len(stamps),
                             error=f"got {len(stamps)} tokens, asked {spec.output_len}")
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return RequestResult(True, len(stamps), stamps[0] - start, gaps, stamps[-1] - start)


async def _drive(client: SseClient, spec: LoadSpec, prompts: list[list[int]],
                 offsets: list[float] | None = None) -> list[RequestResult]:
    """The prompts' requests on `spec.concurrency` slots: a closed loop, or open loop when
    `offsets` gives each one's send time (seconds after now)."""
    if offsets is not None:
        return await _arrive(client, spec, prompts, offsets)
    queue = list(reversed(prompts))
    results: list[RequestResult] = []

    async def worker(slot: int) -> None:
        while queue:
            results.append(await _one(client, slot, spec, queue.pop()))

    await asyncio.gather(*(worker(slot)
                           for slot in range(min(spec.concurrency, len(prompts)))))
    return results


async def _arrive(client: SseClient, spec: LoadSpec, prompts: list[list[int]],
                  offsets: list[float]) -> list[RequestResult]:
    """Open loop: prompt i is sent `offsets[i]` s after the start on a free slot; one that
    finds none waits for the first to free (arrival order), and says so."""
    free: asyncio.Queue[int] = asyncio.Queue()
    for slot in range(min(spec.concurrency, len(prompts))):
        free.put_nowait(slot)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(prompt: list[int], offset: float) -> RequestResult:
        await asyncio.sleep(start + offset - loop.time())
        waited = free.empty()
        slot = await free.get()
        try:
            result = await _one(client, slot, spec, prompt)
        finally:
            free.put_nowait(slot)
        return dataclasses.replace(result, waited=waited)

    return list(await asyncio.gather(*(one(p, at) for p, at in zip(prompts, offsets,
                                                                    strict=True))))


async def steady_load(url: str, spec: LoadSpec, stop: asyncio.Event) -> int:
    """`spec.concurrency` clients each sending the next request as its last finishes, until
    `stop` is set (requests in flight then finish); nothing is measured. Returns the requests
    sent. For a window inside a load that neither starts nor drains (a profile)."""
    prompts = make_prompts(spec, max(spec.num_requests, spec.concurrency), salt=3)
    sent = 0

    async def worker(slot: int) -> None:
        nonlocal sent
        while not stop.is_set():
            prompt = prompts[sent % len(prompts)]
            sent += 1
            await _one(client, slot, spec, prompt)

    with _client(url, spec) as client:
        await asyncio.gather(*(worker(slot) for slot in range(spec.concurrency)))
    return sent


@contextlib.contextmanager
def _client(url: str, spec: LoadSpec) -> Iterator[SseClient]:
    client = SseClient(url, {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key
                       else None)
    try:
        yield client
    finally:
        client.close()


async def _warm(client: SseClient, spec: LoadSpec) -> None:
    """spec.num_warmup requests on prompts of their own (salt 1), none of them measured."""
    await _drive(client, spec, warmup_prompts(spec))


async def warm_up(url: str, spec: LoadSpec) -> None:
    """Only the warm-up requests, so that a caller can read the server's counters between the
    warm-up and the measured requests."""
    with _client(url, spec) as client:
        await _warm(client, spec)


async def run_load(url: str, spec: LoadSpec) -> RunResult:
    """Warm-up, then the measured requests at `spec.concurrency`: from this process, or with
    `spec.num_clients` > 1 from that many processes, each driving its share of the slots.

    One Python client parses every streamed event on one core (13-26 µs of CPU a token at a
    served cell's pace on the H200's host, results/2026-12-04-h200-frontend), so at tens of
    thousands of tokens a second a single client, not the server, could set the pace; the
    processes start together (a barrier) and the run's wall time spans the first start to the
    last finish."""
    prompts = measured_prompts(spec)
    offsets = arrival_offsets(spec, len(prompts))
    with _client(url, spec) as client:
        if spec.num_warmup:
            await _warm(client, spec)
        if spec.num_clients == 1:
            start, cpu_start = time.perf_counter(), time.thread_time()
            results = await _drive(client, spec, prompts, offsets)
            wall, cpu_s = time.perf_counter() - start, time.thread_time() - cpu_start
    if spec.num_clients > 1:
        results, wall, cpu_s = await asyncio.to_thread(_drive_in_processes, url, spec, prompts,
                                                       offsets)
    return summarize(spec, results, wall, cpu_s)


def client_shares(spec: LoadSpec, requests: list) -> list[tuple[int, list]]:
    """(slots, requests) of each client process: slots split as evenly as they go, and request
    j to the process of slot j mod concurrency, so each process's queue lasts as long."""
    num = min(spec.num_clients, spec.concurrency)
    return [(spec.concurrency // num + (i < spec.concurrency % num),
             [p for j, p in enumerate(requests) if (j % spec.concurrency) % num == i])
            for i in range(num)]


def _drive_in_processes(url: str, spec: LoadSpec, prompts: list[list[int]],
                        offsets: list[float] | None
                        ) -> tuple[list[RequestResult], float, float]:
    """The processes' results, the wall time from the first start to the last finish, and
    their CPU seconds over their requests. Open loop, each process sends its share of the
    arrivals at their times after its start (the processes start together: a barrier)."""
    context = multiprocessing.get_context("spawn")
    shares = client_shares(spec, list(zip(prompts, offsets or [None] * len(prompts),
                                          strict=True)))
    barrier, answers = context.Barrier(len(shares)), context.Queue()
    processes = [context.Process(target=_client_process, daemon=True,
                                 args=(url, dataclasses.replace(spec, concurrency=slots),
                                       share, barrier, answers, os.getpid()))
                 for slots, share in shares]
    for process in processes:
        process.start()
    try:
        spans = _answers(answers, processes, spec.timeout_s)
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    results = [result for _, _, share, _ in spans for result in share]
    missing = sum(len(share) for _, share in shares) - len(results)
    results += [RequestResult(False, error="a client process died")] * missing
    ran = [(start, end) for start, end, _, _ in spans if start is not None]
    cpu_s = sum(cpu for _, _, _, cpu in spans)
    if not ran:
        return results, 0.0, cpu_s
    return results, max(end for _, end in ran) - min(start for start, _ in ran), cpu_s


def _answers(answers, processes, timeout_s: float) -> list[tuple]:
    """Each process's answer; stops early once every process has exited (one that died
    without answering is missing from the list)."""
    spans, deadline = [], time.monotonic() + timeout_s
    while len(spans) < len(processes) and time.monotonic() < deadline:
        try:
            spans.append(answers.get(timeout=1.0))
        except queue.Empty:
            if not any(process.is_alive() for process in processes) and answers.empty():
                break
    return spans


def _client_process(url: str, spec: LoadSpec, requests: list[tuple[list[int], float | None]],
                    barrier, answers, gate_pid: int) -> None:
    """One client process: its slots' requests; answers (start, end, results, CPU seconds),
    start and end on the system-wide monotonic clock (None when it could not run). Killed with the
    gate: with no reader, its answer could never leave and the process would hang at exit."""
    end_with_parent(gate_pid, signal.SIGKILL)
    prompts = [prompt for prompt, _ in requests]
    offsets = None if spec.request_rate == 0 else [offset for _, offset in requests]

    async def drive() -> tuple[float, float, list[RequestResult], float]:
        with _client(url, spec) as client:
            barrier.wait(timeout=BARRIER_TIMEOUT_S)
            start, cpu_start = time.monotonic(), time.process_time()
            results = await _drive(client, spec, prompts, offsets)
            return start, time.monotonic(), results, time.process_time() - cpu_start

    try:
        answers.put(eventloop.run(drive(), spec.event_loop))
    except Exception as err:  # noqa: BLE001 - the parent must hear of it, not wait out its timeout
        barrier.abort()  # the others stop waiting for this one
        answers.put((None, None,
                     [RequestResult(False, error=f"client process: {err!r}")] * len(prompts),
                     0.0))


def _tpot_s(result: RequestResult) -> float | None:
    if result.latency_s is None or result.ttft_s is None or result.output_tokens < 2:
        return None
    return (result.latency_s - result.ttft_s) / (result.output_tokens - 1)


def _rate(count: int, wall_s: float) -> float | None:
    return round(count / wall_s, 3) if wall_s > 0 else None


def summarize(spec: LoadSpec, results: list[RequestResult], wall_s: float,
              client_cpu_s: float = 0.0) -> RunResult:
    """The run's ServeMetrics over its completed requests, its first five errors, and the
    client's CPU seconds over them."""
    ok = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in ok)
    prompt = spec.total_prompt_len * len(ok)
    samples = {"ttft": [r.ttft_s for r in ok], "itl": [gap for r in ok for gap in r.itl_s],
               "e2el": [r.latency_s for r in ok],
               "tpot": [t for t in map(_tpot_s, ok) if t is not None]}
    latencies = {key: value for name in LATENCIES
                 for key, value in latency_fields(samples[name], name).items()}
    metrics = ServeMetrics(
        max_concurrency=spec.concurrency, duration=round(wall_s, 4), completed=len(ok),
        failed=len(results) - len(ok), total_input_tokens=prompt, total_output_tokens=output,
        request_throughput=_rate(len(ok), wall_s), output_throughput=_rate(output, wall_s),
        total_token_throughput=_rate(prompt + output, wall_s), **latencies)
    return RunResult(metrics, tuple(r.error for r in results if r.error)[:5],
                     round(client_cpu_s, 4), sum(r.waited for r in results))
