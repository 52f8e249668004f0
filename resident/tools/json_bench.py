"""What encoding a streamed token's SSE event costs: the stdlib's json against orjson.

    python -m resident.tools.json_bench [--events 200000] [--format table|json]

Encodes the event the API writes for one streamed token (api._Completion._token_event's shape:
the envelope, one choice with its text and token id), plain and with `logprobs: 5` (the
choice's logprobs with five alternatives), each way the API could: `json.dumps(...).encode()`
(what api.py did) and `jsonenc.dumps` (orjson where installed). Reports µs per event, the best
of five rounds (the least disturbed by other processes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from resident.render import OutputFormat, render
from resident.server import jsonenc
from resident.tool_args import add_format, count

ROUNDS = 5


def token_event(logprobs: bool) -> dict[str, Any]:
    """A streamed token's event as the API builds it."""
    choice: dict[str, Any] = {"index": 0, "text": " the", "token_ids": [279],
                              "finish_reason": None, "logprobs": None}
    if logprobs:
        top = {" the": -0.25, " a": -1.75, " an": -3.5, " this": -4.0, " that": -4.25,
               " its": -5.0}
        choice["logprobs"] = {"tokens": [" the"], "token_logprobs": [-0.25],
                              "top_logprobs": [top], "text_offset": [118]}
    return {"id": "cmpl-3f2a9c1e0b7d4e5f8a6b9c0d1e2f3a4b", "object": "text_completion",
            "created": 1764777600, "model": "qwen3.5-0.8b", "choices": [choice]}


def best_us(encode: Callable[[Any], bytes], event: dict[str, Any], num_events: int) -> float:
    """µs per event, the best of ROUNDS rounds of num_events encodes."""
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(num_events):
            encode(event)
        best = min(best, time.perf_counter() - start)
    return best / num_events * 1e6


def measure(num_events: int) -> list[dict[str, Any]]:
    rows = []
    for logprobs in (False, True):
        event = token_event(logprobs)
        stdlib = best_us(lambda e: json.dumps(e).encode(), event, num_events)
        fast = best_us(jsonenc.dumps, event, num_events)
        rows.append({"event": "logprobs 5" if logprobs else "plain",
                     "bytes": len(jsonenc.dumps(event)), "json_us": round(stdlib, 3),
                     f"{jsonenc.ENCODER}_us": round(fast, 3),
                     "speedup": round(stdlib / fast, 2)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=count, default=200_000)
    add_format(parser)
    args = parser.parse_args(argv)
    render({"json_bench": measure(args.events)}, OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
