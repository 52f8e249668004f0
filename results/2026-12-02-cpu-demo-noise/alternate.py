"""Two engines of the tiny model in one process, host planning (`off`) and resident planning
(`auto`), alternating request by request (64 prompt tokens, 32 greedy output tokens each):
the median decode step of each request, then the per-request ratio auto / off.

    python results/2026-12-02-cpu-demo-noise/alternate.py [REQUESTS]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from resident.config import EngineConfig
from resident.engine.engine import build_engine, freeze_heap
from resident.engine.types import EngineRequest, SamplingParams
from resident.model.config import load_model_config


def decode_ms(engine, request: EngineRequest) -> float:
    """The median wall time of the request's decode steps, alone in the engine."""
    engine.add_request(request)
    times = []
    while engine.has_work():
        start = time.perf_counter()
        engine.step()
        if engine.last_step_kind == "decode":
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    model = load_model_config("tiny")
    engines = {mode: build_engine(model, EngineConfig(resident_planning=mode), "cpu")
               for mode in ("off", "auto")}
    freeze_heap()
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    rows = []
    for index in range(count):
        prompt = torch.randint(0, model.vocab_size, (64,), generator=generator).tolist()
        rows.append([decode_ms(engine, EngineRequest(f"r{index}", prompt, params))
                     for engine in engines.values()])
    print(" ".join(f"{off:.2f}/{auto:.2f}" for off, auto in rows))
    ratios = [auto / off for off, auto in rows]
    print(f"auto / off: median {statistics.median(ratios):.3f}, "
          f"sd {statistics.pstdev(ratios):.3f} a request")


if __name__ == "__main__":
    main()
