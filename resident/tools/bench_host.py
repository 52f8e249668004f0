"""Host time of a decode step, resident planning off against auto, with no GPU in the way.

    python -m resident.tools.bench_host [--concurrency 1,16,64,256] [--steps 1000] [--format json]

The tiny model on CPU holds c requests in decode. The bucket's forward (graph replay or eager
model) is replaced by a zero logits tensor of its shape, so what each step times is the host's
share: scheduling, then either the host plan (staging and upload of the rows) or the resident
planner's plan, flush and commit with the token ids' upload, then sampling and emitting. On
the GPU the resident ops themselves run inside the bucket's graph, so they are left out here as
the forward is. The difference between the two columns is what resident planning adds to (or
saves from) the host time between two replays.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from resident.config import EngineConfig
from resident.engine.engine import build_engine
from resident.engine.sampler import StepLogits
from resident.engine.types import EngineRequest, SamplingParams
from resident.model.config import load_model_config
from resident.render import OutputFormat, render
from resident.tools.bench_io import positive_ints

WARM_STEPS = 5


def host_us_per_step(planning: str, concurrency: int, steps: int) -> float:
    model = load_model_config("tiny")
    config = EngineConfig(resident_planning=planning, max_num_seqs=max(concurrency, 1))
    engine = build_engine(model, config, "cpu")
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=steps + 64, ignore_eos=True)
    for index in range(concurrency):
        prompt = torch.randint(0, model.vocab_size, (40,), generator=generator).tolist()
        engine.add_request(EngineRequest(f"r{index}", prompt, params))
    while engine.stats()["steps"]["decode"] < WARM_STEPS:
        engine.step()

    def no_forward(bucket: int, width: int) -> StepLogits:
        logits = torch.zeros(bucket, model.vocab_size)
        return StepLogits(logits, logits.argmax(dim=-1))

    engine.runner.forward_decode = no_forward
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - start) / steps * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16,64,256")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--format", choices=[f.value for f in OutputFormat], default="table")
    args = parser.parse_args(argv)
    cells = positive_ints(parser, "--concurrency", args.concurrency)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    rows = []
    for concurrency in cells:
        off, auto = (host_us_per_step(p, concurrency, args.steps) for p in ("off", "auto"))
        rows.append({"concurrency": concurrency, "off_us": round(off, 1),
                     "auto_us": round(auto, 1), "auto_minus_off_us": round(auto - off, 1)})
    render({"host_time_per_decode_step": rows}, OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
