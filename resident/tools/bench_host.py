"""Host time of a decode step, resident planning off against auto, with no GPU in the way.

    python -m resident.tools.bench_host [--concurrency 1,16,64,256] [--steps 1000]
        [--temperature 0.7 --top-p 0.9] [--phases] [--format json]

The tiny model on CPU holds c requests in decode. The bucket's launch (`Runner.launch_decode`:
on the GPU one graph replay, the draw inside it where the step draws) is replaced by fixed
logits of its shape and, for a drawing step, fixed tokens packed as a drawing graph leaves them,
so what each step times is the host's share: scheduling,
then either the host plan (staging and upload of the rows) or the resident planner's plan,
flush and commit with the token ids' upload, then sampling and emitting. On the GPU the resident
ops and the draw run inside the bucket's graph, so they are left out here as the forward is.
The difference between the two columns is what resident planning adds to (or saves from) the
host time between two replays. One share reads high here: the host-planned arm's uploads
(whole block-table rows, inputs.py: 256 KB at c=256 of the tiny model) are copies this thread
makes on CPU, ~0.6 ms a step at c=256 in `kv_stage`, where CUDA queues them asynchronously.

--temperature / --top-p make every request sample (seeded by its index), so each step stages
its draw: by slot under resident planning, every row uploaded when host-planned. --phases runs
with phase timing on (engine/phases.py; its laps add a few µs a step) and adds each arm's
`sampler`, `plan` and `main` thread-CPU parts a step: the sampler part is issue 36's sampler
host time, here without the GPU's copy and event calls.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import torch

from resident.config import EngineConfig
from resident.engine.draw import packed_drawn
from resident.engine.engine import Engine, build_engine
from resident.engine.sampler import StepLogits
from resident.engine.types import EngineRequest, SamplingParams
from resident.heap import freeze_heap
from resident.model.config import load_model_config
from resident.render import OutputFormat, render
from resident.tool_args import add_draw, add_format, count, counts
from resident.tools.bench import GREEDY, Draw

WARM_STEPS = 5
PARTS = ("sampler", "plan", "main")


def host_step(planning: str, concurrency: int, steps: int, draw: Draw = GREEDY,
              phases: bool = False) -> dict[str, float]:
    """µs a decode step (`step_us`), and with `phases` its PARTS (`<part>_us`). The heap alive
    once the engine is built is frozen while it steps, as the engine core freezes it
    (heap.py): else each full collection walks torch's and the engine's objects, several
    hundred µs a step at c=256 here, charged to whichever part it falls in."""
    engine = _decoding_engine(planning, concurrency, steps, draw, phases)
    freeze_heap()
    try:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        elapsed = time.perf_counter() - start
    finally:
        gc.unfreeze()  # the next engine's, and a caller's (the tests'), are collected as usual
    result = {"step_us": elapsed / steps * 1e6}
    if phases:
        parts = engine.phases.report()["decode"]
        result |= {f"{part}_us": parts[part] * 1e3 for part in PARTS}
    return result


def _decoding_engine(planning: str, concurrency: int, steps: int, draw: Draw,
                     phases: bool) -> Engine:
    """c requests past their prefill and a few decode steps, the forward and draw replaced
    by fixed outputs, the phase sums reset."""
    model = load_model_config("tiny")
    config = EngineConfig(resident_planning=planning, max_num_seqs=max(concurrency, 1),
                          phase_timing="on" if phases else "off")
    engine = build_engine(model, config, "cpu")
    generator = torch.Generator().manual_seed(0)
    for index in range(concurrency):
        prompt = torch.randint(0, model.vocab_size, (40,), generator=generator).tolist()
        params = SamplingParams(max_tokens=steps + 64, ignore_eos=True, seed=index,
                                temperature=draw.temperature, top_p=draw.top_p)
        refused = engine.add_request(EngineRequest(f"r{index}", prompt, params))
        if refused is not None:
            raise ValueError(f"--steps {steps}: {refused.error}")
    while engine.stats()["steps"]["decode"] < WARM_STEPS:
        engine.step()
    replayed: dict[tuple[int, bool], StepLogits] = {}

    def replayed_launch(bucket: int, width: int, draw: bool) -> StepLogits:
        """A decode bucket's graph replay (`Runner.launch_decode`): its fixed outputs, the
        draw's packed as a drawing graph leaves them, published into the token ring as the
        graph's last kernel would (on the GPU that is device work; here a small CPU copy)."""
        if (bucket, draw) not in replayed:
            zeros = torch.zeros(bucket, model.vocab_size)
            greedy = zeros.argmax(dim=-1)
            drawn = None
            if draw:
                drawn = packed_drawn(bucket, greedy.device)
                drawn.tokens.copy_(greedy)
                drawn.failed.zero_()
            replayed[bucket, draw] = StepLogits(zeros, greedy, drawn)
        return engine.runner.timed_decode(engine.runner.publish, replayed[bucket, draw])

    engine.runner.launch_decode = replayed_launch
    engine.phases.reset()
    return engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=counts, default="1,16,64,256")
    parser.add_argument("--steps", type=count, default=1000)
    add_draw(parser)
    parser.add_argument("--phases", action="store_true",
                        help="phase timing on: each arm's sampler, plan and main parts too")
    add_format(parser)
    args = parser.parse_args(argv)
    try:
        draw = Draw(args.temperature, args.top_p)
    except ValueError as error:
        parser.error(str(error))
    rows = []
    for concurrency in args.concurrency:
        off, auto = (host_step(p, concurrency, args.steps, draw, args.phases)
                     for p in ("off", "auto"))
        row = {"concurrency": concurrency, "off_us": round(off["step_us"], 1),
               "auto_us": round(auto["step_us"], 1),
               "auto_minus_off_us": round(auto["step_us"] - off["step_us"], 1)}
        for part in PARTS if args.phases else ():
            row |= {f"off_{part}_us": round(off[f"{part}_us"], 1),
                    f"auto_{part}_us": round(auto[f"{part}_us"], 1)}
        rows.append(row)
    render({"host_time_per_decode_step": rows}, OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
