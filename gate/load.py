"""Load: fixed-concurrency streaming completions against an OpenAI-compatible server.

Prompts are random token ids below the server's vocabulary, seeded, so no prefix cache helps and
two arms given one seed see the same prompts. Every request asks for exactly `output_len` tokens
(ignore_eos). Warm-up requests run first at the same concurrency and are left out.
TTFT = first streamed token; ITL = the gaps between a request's tokens; output tok/s = output
tokens of the measured requests over the measured wall time. Failed requests are counted and kept
out of the distributions.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass(frozen=True)
class LoadSpec:
    concurrency: int
    num_requests: int
    prompt_len: int = 512
    output_len: int = 256
    vocab_size: int = 512
    seed: int = 0
    num_warmup: int = 0
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("concurrency", "num_requests", "prompt_len", "output_len", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_warmup < 0:
            raise ValueError(f"num_warmup must be >= 0, got {self.num_warmup}")


@dataclass
class RequestResult:
    ok: bool
    output_tokens: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class RunResult:
    concurrency: int
    num_requests: int
    num_failed: int
    wall_s: float
    output_tokens: int
    output_tok_s: float
    ttft_p50_ms: float | None
    itl_p50_ms: float | None
    itl_mean_ms: float | None
    errors: tuple[str, ...] = ()


def make_prompts(spec: LoadSpec, count: int, salt: int) -> list[list[int]]:
    rng = random.Random(f"{spec.seed}:{salt}")
    return [[rng.randrange(spec.vocab_size) for _ in range(spec.prompt_len)]
            for _ in range(count)]


async def _one(session: aiohttp.ClientSession, url: str, spec: LoadSpec,
               prompt: list[int]) -> RequestResult:
    body = {"prompt": prompt, "max_tokens": spec.output_len, "ignore_eos": True,
            "temperature": 0, "stream": True}
    if spec.model:
        body["model"] = spec.model
    start = time.perf_counter()
    stamps: list[float] = []
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                return RequestResult(False, error=f"HTTP {resp.status}: {await resp.text()}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("error"):
                    return RequestResult(False, error=str(event["error"]))
                for _ in (event.get("choices") or [{}])[0].get("token_ids", []):
                    stamps.append(time.perf_counter())
    except (TimeoutError, aiohttp.ClientError) as err:
        return RequestResult(False, error=repr(err))
    if len(stamps) != spec.output_len:
        return RequestResult(False, len(stamps),
                             error=f"got {len(stamps)} tokens, asked {spec.output_len}")
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return RequestResult(True, len(stamps), stamps[0] - start, gaps)


async def _drive(session, url: str, spec: LoadSpec, prompts: list[list[int]]):
    queue = list(reversed(prompts))
    results: list[RequestResult] = []

    async def worker() -> None:
        while queue:
            results.append(await _one(session, url, spec, queue.pop()))

    await asyncio.gather(*(worker() for _ in range(min(spec.concurrency, len(prompts)))))
    return results


def _client(spec: LoadSpec) -> aiohttp.ClientSession:
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else None
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    connector = aiohttp.TCPConnector(limit=spec.concurrency + 4)
    return aiohttp.ClientSession(headers=headers, timeout=timeout, connector=connector)


async def _warm(session: aiohttp.ClientSession, url: str, spec: LoadSpec) -> None:
    """spec.num_warmup requests on prompts of their own (salt 1), none of them measured."""
    await _drive(session, url, spec, make_prompts(spec, spec.num_warmup, salt=1))


async def warm_up(url: str, spec: LoadSpec) -> None:
    """Only the warm-up requests, so that a caller can read the server's counters between the
    warm-up and the measured requests."""
    async with _client(spec) as session:
        await _warm(session, url, spec)


async def run_load(url: str, spec: LoadSpec) -> RunResult:
    """Warm-up, then the measured requests at `spec.concurrency`."""
    async with _client(spec) as session:
        if spec.num_warmup:
            await _warm(session, url, spec)
        start = time.perf_counter()
        results = await _drive(session, url, spec, make_prompts(spec, spec.num_requests, 2))
        wall = time.perf_counter() - start
    return summarize(spec, results, wall)


def _ms(values: list[float], fn) -> float | None:
    return round(fn(values) * 1e3, 3) if values else None


def summarize(spec: LoadSpec, results: list[RequestResult], wall_s: float) -> RunResult:
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    itl = [gap for r in ok for gap in r.itl_s]
    return RunResult(
        concurrency=spec.concurrency, num_requests=len(results),
        num_failed=len(results) - len(ok), wall_s=round(wall_s, 4), output_tokens=tokens,
        output_tok_s=round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
        ttft_p50_ms=_ms([r.ttft_s for r in ok], statistics.median),
        itl_p50_ms=_ms(itl, statistics.median), itl_mean_ms=_ms(itl, statistics.mean),
        errors=tuple(r.error for r in results if r.error)[:5],
    )
