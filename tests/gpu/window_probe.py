"""late_launch on a GPU server: does the window open, how long it waits, what arrivals it takes.

    python tests/gpu/window_probe.py [--model qwen3.5-0.8b] [--concurrency 16] [--rate 25]

Starts `resident serve` with late_launch=on and phase timing, sends `--requests` requests
(random 512-token prompts, 64 out) arriving as a Poisson process at `--rate` a second with at
most `--concurrency` in flight, then prints JSON: the decode steps' phases (`window`: the wall
the step polled for arrivals before launching the next, `event_sync`: its wait for the GPU
after), the window's arrivals against the requests, and the server's mean queue / prefill /
TTFT (engine/launch_window.py). A window that never opens reads `window` ~0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from resident.model.config import load_model_config  # noqa: E402
from tests.server_fixture import Server, get, metrics, post  # noqa: E402


async def load(url: str, requests: int, concurrency: int, rate: float, vocab: int) -> None:
    gate, rng = asyncio.Semaphore(concurrency), random.Random(0)

    async def one(prompt: list[int]) -> None:
        async with gate:
            status, _ = await post(url + "/v1/completions",
                                   {"prompt": prompt, "max_tokens": 64, "ignore_eos": True})
            assert status == 200, status

    tasks = []
    for _ in range(requests):
        tasks.append(asyncio.create_task(one([rng.randrange(vocab) for _ in range(512)])))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)


async def probe(url: str, args: argparse.Namespace) -> dict:
    _, models = await get(url + "/v1/models")
    vocab = load_model_config(args.model).vocab_size
    await load(url, 8, args.concurrency, args.rate, vocab)  # warm-up
    await post(url + "/debug/phases/reset", {})
    before = await metrics(url)
    await load(url, args.requests, args.concurrency, args.rate, vocab)
    await asyncio.sleep(0.2)  # the last request's histograms
    after = await metrics(url)
    _, phases = await get(url + "/debug/phases")

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    def mean_ms(name: str) -> float:
        count = delta(f"{name}_count")
        return round(1e3 * delta(f"{name}_sum") / count, 3) if count else 0.0

    return {"model": models["data"][0]["id"], "requests": args.requests,
            "window_arrivals": delta("resident_window_arrivals_total"),
            "decode_phases": phases.get("kinds", {}).get("decode"),
            "queue_ms": mean_ms("resident_request_queue_seconds"),
            "prefill_ms": mean_ms("resident_request_prefill_seconds"),
            "ttft_ms": mean_ms("resident_time_to_first_token_seconds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3.5-0.8b")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=float, default=25.0)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--late-launch", default="on")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    server = Server("--set", f"late_launch={args.late_launch}", "--set", "phase_timing=on",
                    model=args.model, device=args.device).wait_ready(timeout_s=600)
    try:
        print(json.dumps(asyncio.run(probe(server.url, args)), indent=1))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
