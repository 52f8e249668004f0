"""Where an engine's start-up goes: builds the engine as the bench does (knobs from argv, by
default auto+triton), times Triton's compiles and autotune benchmarking, and prints the spans
and TorchDynamo's compile-time table."""

import collections
import functools
import logging
import sys
import time

import torch._dynamo.utils as dynamo_utils
import triton.runtime.autotuner as autotuner
import triton.runtime.jit as jit

from resident.config import build_engine_config, model_yaml_knobs, parse_set_options
from resident.engine.engine import build_engine
from resident.model.config import load_model_config

spent: collections.Counter = collections.Counter()
calls: collections.Counter = collections.Counter()


def timed(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - started
            calls[label] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    timed(autotuner.Autotuner, "_bench", "triton autotune bench (per config)")
    timed(jit.JITFunction, "_do_compile", "triton jit _do_compile (cache hit or miss)")
    knobs = sys.argv[1:] or ["attention_backend=triton", "resident_planning=auto"]
    model = load_model_config("qwen3.5-0.8b")
    config = build_engine_config(model_yaml_knobs("qwen3.5-0.8b"), None,
                                 parse_set_options(knobs))
    started = time.perf_counter()
    engine = build_engine(model, config, "cuda")
    print("TOTAL build_engine", round(time.perf_counter() - started, 1), engine.startup.line())
    for label, seconds in spent.items():
        print(f"SPENT {label}: {seconds:.1f} s in {calls[label]} calls")
    print(dynamo_utils.compile_times(repr="str"))


if __name__ == "__main__":
    main()
