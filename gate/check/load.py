"""The check's requests: every prompt once to one server, greedy, natural EOS, at a fixed
concurrency, each answer kept whole (tokens, finish reason and, where the server gives them,
each token's top logprobs by token id).

Unlike gate/run/load.py (timed streams of random token prompts), these are plain completions of text
prompts: the check compares what the servers answer, not how fast.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from gate.check.config import SEEDED_SAMPLING

FINISHED = ("stop", "length")  # the finish reasons of a request that went right
TOKEN_ID = "token_id:"  # how return_tokens_as_token_ids names a token


@dataclass(frozen=True)
class Answer:
    """One prompt's completion by one server. `top` holds, per generated token, the server's
    logprobs by token id (the sampled token's and the top k); empty when it gives none."""

    ok: bool
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    top: tuple[dict[int, float], ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "token_ids": list(self.token_ids),
                "finish_reason": self.finish_reason, "error": self.error}


def _body(prompt: str, max_tokens: int, logprobs: int | None,
          seed: int | None = None) -> dict[str, Any]:
    """Greedy, or with a seed SEEDED_SAMPLING and that seed."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if seed is not None:
        body |= {**SEEDED_SAMPLING, "seed": seed}
    if logprobs is not None:
        body |= {"logprobs": logprobs, "return_tokens_as_token_ids": True}
    return body


def _top_by_id(logprobs: dict[str, Any] | None, count: int) -> tuple[dict[int, float], ...]:
    """A choice's top_logprobs keyed by token id; empty unless every token has its entry and
    every key names an id (return_tokens_as_token_ids)."""
    entries = (logprobs or {}).get("top_logprobs") or []
    if len(entries) != count or not all(
            isinstance(e, dict) and all(k.startswith(TOKEN_ID) for k in e) for e in entries):
        return ()
    return tuple({int(k.removeprefix(TOKEN_ID)): float(v) for k, v in e.items()}
                 for e in entries)


def parse_answer(status: int, data: Any, max_tokens: int) -> Answer:
    """An HTTP answer as an Answer: ok only for a 200 whose choice finished on stop or length
    with between 1 and max_tokens tokens (exactly max_tokens on length)."""
    if status != 200 or not isinstance(data, dict):
        return Answer(False, error=f"HTTP {status}: {str(data)[:300]}")
    choice = (data.get("choices") or [{}])[0]
    tokens, reason = choice.get("token_ids"), choice.get("finish_reason")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return Answer(False, finish_reason=reason, error="the answer has no token_ids")
    if reason not in FINISHED or not 1 <= len(tokens) <= max_tokens or (
            reason == "length" and len(tokens) != max_tokens):
        return Answer(False, tuple(tokens), reason,
                      error=f"finish_reason {reason!r} after {len(tokens)} tokens "
                            f"(max_tokens {max_tokens})")
    return Answer(True, tuple(tokens), reason, _top_by_id(choice.get("logprobs"), len(tokens)))


async def _complete(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Answer:
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            status, text = resp.status, await resp.text()
    except (TimeoutError, aiohttp.ClientError) as err:
        return Answer(False, error=repr(err))
    try:
        data = json.loads(text)
    except ValueError:
        data = text
    return parse_answer(status, data, body["max_tokens"])


async def complete_all(url: str, prompts: tuple[str, ...], concurrency: int,
                       max_tokens: tuple[int, ...], logprobs: int | None,
                       timeout_s: float = 1800.0, seeded: bool = False) -> list[Answer]:
    """Every prompt once (prompt i capped at max_tokens[i]), at most `concurrency` in flight,
    answers in prompt order; seeded: sampled (SEEDED_SAMPLING), each prompt's index its seed."""
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=concurrency + 2)) as s:
        async def one(index: int, prompt: str, cap: int) -> Answer:
            body = _body(prompt, cap, logprobs, index if seeded else None)
            async with gate:
                return await _complete(s, url, body)

        return list(await asyncio.gather(*(
            one(i, prompt, cap)
            for i, (prompt, cap) in enumerate(zip(prompts, max_tokens, strict=True)))))


async def gives_logprobs(url: str) -> bool:
    """Whether the server answers `logprobs` (a server from before they existed refuses the
    field with a 400 naming it); any other refusal is the server's failure, raised."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.post(
            url + "/v1/completions", json=_body("a", 1, 0)) as resp:
        status, text = resp.status, await resp.text()
    if status == 200:
        return True
    if status == 400 and "logprobs" in text:
        return False
    raise RuntimeError(f"a one-token completion got HTTP {status}: {text[:300]}")
