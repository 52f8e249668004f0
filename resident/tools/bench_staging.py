"""Host time of staging a mixed step's inputs: c decode rows and one prompt chunk.

    python -m resident.tools.bench_staging [--concurrency 16,64,256] [--repeat 500] [--format json]

The tiny model on CPU holds c requests in decode (300-token prompts, decoded a few steps), and
one more request's 512-token prompt arrives, so the scheduler plans a mixed step. Its varlen
inputs are then staged and uploaded (`VarlenInputs.stage`: each row's ids, positions, KV write
locations, block-table row and state slot on the host, the copies to the step buffers) `repeat`
times, with every decode row's last token taken from the step before's sampled tokens as under
plan_ahead=launch. What one staging costs the host is the median of five batches' means. This
is the `kv_plan` and `kv_stage` share of a mixed step in the phase tables, whose rows the GPU
waits for when the step is launched.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

from resident.config import EngineConfig
from resident.engine.buffers import SampledTokens
from resident.engine.engine import build_engine
from resident.engine.types import EngineRequest, SamplingParams
from resident.model.config import load_model_config
from resident.render import OutputFormat, render
from resident.tool_args import add_format, count, counts

PROMPT_LEN, NEW_PROMPT_LEN = 300, 512
BATCHES = 5


def staging_us(concurrency: int, repeat: int) -> dict:
    model = load_model_config("tiny")
    config = EngineConfig(dtype="float32", compile="off", padded_prefill="off",
                          plan_ahead="off", max_num_seqs=concurrency + 1,
                          num_kv_pages=max(4096, 32 * (concurrency + 1)),
                          prefill_token_budget=max(2048, NEW_PROMPT_LEN + concurrency))
    engine = build_engine(model, config, "cpu")
    rng = random.Random(0)

    def prompt(length: int) -> list[int]:
        return [rng.randrange(model.vocab_size) for _ in range(length)]

    params = SamplingParams(max_tokens=64, ignore_eos=True)
    for index in range(concurrency):
        engine.add_request(EngineRequest(f"r{index}", prompt(PROMPT_LEN), params))
    while not all(request.output_ids for request in engine.requests.values()):
        engine.step()
    engine.add_request(EngineRequest("new", prompt(NEW_PROMPT_LEN), params))
    plan = engine.scheduler.schedule()
    if plan.kind != "mixed" or plan.num_decode_rows != concurrency:
        raise RuntimeError(f"expected a mixed step of {concurrency} decode rows, got {plan.kind} "
                           f"with {plan.num_decode_rows}")
    decode = plan.rows[:concurrency]
    sampled = SampledTokens(torch.zeros(concurrency, dtype=torch.int64),
                            {row.request.request_id: i for i, row in enumerate(decode)})
    stage = engine.inputs.varlen.stage
    for _ in range(repeat // 10 + 1):
        stage(plan, sampled)
    means = []
    for _ in range(BATCHES):
        start = time.perf_counter()
        for _ in range(repeat):
            stage(plan, sampled)
        means.append((time.perf_counter() - start) / repeat * 1e6)
    return {"concurrency": concurrency, "rows": len(plan.rows), "tokens": plan.num_tokens,
            "staging_us": round(statistics.median(means), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=counts, default="16,64,256")
    parser.add_argument("--repeat", type=count, default=500)
    add_format(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [staging_us(level, args.repeat) for level in args.concurrency]
    render({"mixed_step_staging": rows}, OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
