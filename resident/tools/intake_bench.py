"""What taking in one completion request costs, by prompt length: the API process's part and the
engine core's, each in the loop that serves every other stream.

    python -m resident.tools.intake_bench [--prompt-lens 256,1280,4096] [--format table|json]

A request whose prompt is a list of token ids (what the gate's load sends), greedy, streamed:
`api_read_us` reads its body as the API does (jsonenc.loads: orjson where installed, else the
stdlib), `api_validate_us` validates it (validation.parse_completion_request), `api_send_us`
pickles the AddRequest the API sends the core; `core_receive_us` unpickles it and
`core_check_us` is the engine's own check of the prompt's ids (engine.ids_outside). A wave of
c such requests holds up the API (and the core) for about c times these: a closed loop's wave
of 64 prompts of 1,280 tokens cost the served TTFT p50 21 ms more than in process on the H200
(results/2026-12-04-h200-prefix-tail).
Each figure is the best of five rounds (the least disturbed by other processes).
"""

from __future__ import annotations

import argparse
import pickle
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from resident.engine.engine import ids_outside
from resident.engine.types import EngineRequest, SamplingParams
from resident.render import OutputFormat, render
from resident.server import jsonenc
from resident.server.protocol import AddRequest
from resident.server.tokenizer import ByteTokenizer
from resident.server.validation import parse_completion_request
from resident.tool_args import add_format, count, counts

ROUNDS = 5
VOCAB = 248_320  # Qwen3.5's
MAX_MODEL_LEN = 262_144


def best_us(work: Callable[[], Any], repeats: int) -> float:
    """µs per call, the best of ROUNDS rounds of `repeats` calls."""
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(repeats):
            work()
        best = min(best, time.perf_counter() - start)
    return best / repeats * 1e6


def measure(prompt_len: int, repeats: int) -> dict[str, Any]:
    rng = random.Random(prompt_len)
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_len)]
    raw = jsonenc.dumps({"prompt": prompt, "max_tokens": 256, "ignore_eos": True,
                         "temperature": 0, "stream": True})
    body = jsonenc.loads(raw)
    tokenizer = ByteTokenizer(VOCAB)
    parsed = parse_completion_request(body, tokenizer, "m", VOCAB, MAX_MODEL_LEN)
    request = EngineRequest("cmpl-0", parsed.prompt_ids, SamplingParams(max_tokens=256))
    message = pickle.dumps(AddRequest(request), pickle.HIGHEST_PROTOCOL)
    return {
        "prompt_len": prompt_len, "body_bytes": len(raw),
        "api_read_us": round(best_us(lambda: jsonenc.loads(raw), repeats), 1),
        "api_validate_us": round(best_us(lambda: parse_completion_request(
            body, tokenizer, "m", VOCAB, MAX_MODEL_LEN), repeats), 1),
        "api_send_us": round(best_us(lambda: pickle.dumps(AddRequest(request),
                                                          pickle.HIGHEST_PROTOCOL), repeats), 1),
        "core_receive_us": round(best_us(lambda: pickle.loads(message), repeats), 1),
        "core_check_us": round(best_us(lambda: ids_outside(request.prompt_token_ids, VOCAB),
                                       repeats), 1),
        "reader": "orjson" if jsonenc.FAST_LOADS else "json",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-lens", type=counts, default="256,1280,4096")
    parser.add_argument("--repeats", type=count, default=200)
    add_format(parser)
    args = parser.parse_args(argv)
    rows = [measure(n, args.repeats) for n in args.prompt_lens]
    render({"intake_bench": rows}, OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
