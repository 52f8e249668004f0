"""What resident planning costs a CPU decode step, measured without a server or the gate.

    python -m resident.tools.planning_cost [--requests 60] [--model tiny] [--format table|json]

Two engines of the model in one process on the CPU, host planning (`resident_planning=off`) and
resident planning (`auto`), take the same prompts alternately, one request at a time (64 prompt
tokens, 32 greedy output tokens), so both see the same moments of the host. For each request it
takes the median wall time of its decode steps in each engine, then reports the median and the
sd of the per-request ratio auto / off.

This is the effect the README's CPU demo gate has to find: on the CPU the planner's device ops
run on the model's own core, so `auto` costs more there (1.115x at c=1 on the project's 2-vCPU
VM, results/2026-12-02-cpu-demo-noise). On a GPU those ops run inside the captured graph and the
comparison is the gate's, not this tool's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from resident.config import EngineConfig
from resident.engine.engine import Engine, build_engine
from resident.engine.types import EngineRequest, SamplingParams
from resident.heap import freeze_heap
from resident.model.config import load_model_config
from resident.render import OutputFormat, render
from resident.tool_args import add_format, count

PROMPT_TOKENS = 64
OUTPUT_TOKENS = 32
MODES = ("off", "auto")


def decode_ms(engine: Engine, request: EngineRequest) -> float:
    """The median wall time in ms of the request's decode steps, alone in the engine."""
    engine.add_request(request)
    times = []
    while engine.has_work():
        start = time.perf_counter()
        engine.step()
        if engine.last_step_kind == "decode":
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(model_name: str, requests: int, output_tokens: int = OUTPUT_TOKENS,
            seed: int = 0, freeze: bool = True) -> dict[str, object]:
    """Alternates `requests` requests between an `off` and an `auto` engine on the CPU;
    `freeze` moves the built engines out of the garbage collector's walk, as a server does."""
    model = load_model_config(model_name)
    engines = {mode: build_engine(model, EngineConfig(resident_planning=mode), "cpu")
               for mode in MODES}
    if freeze:
        freeze_heap()
    generator = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=output_tokens, ignore_eos=True)
    pairs = []
    for index in range(requests):
        prompt = torch.randint(0, model.vocab_size, (PROMPT_TOKENS,), generator=generator).tolist()
        pairs.append({mode: decode_ms(engine, EngineRequest(f"r{index}", prompt, params))
                      for mode, engine in engines.items()})
    ratios = [pair["auto"] / pair["off"] for pair in pairs]
    return {
        "model": model_name,
        "requests": requests,
        "off_step_ms_median": round(statistics.median(p["off"] for p in pairs), 3),
        "auto_step_ms_median": round(statistics.median(p["auto"] for p in pairs), 3),
        "auto_over_off_median": round(statistics.median(ratios), 3),
        "auto_over_off_sd": round(statistics.pstdev(ratios), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=count, default=60)
    parser.add_argument("--model", default="tiny", help="a model config name; CPU-sized only")
    add_format(parser)
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = measure(args.model, args.requests)
    finally:
        torch.set_num_threads(threads)
    render({"planning_cost": result}, OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
