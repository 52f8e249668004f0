"""Where an engine's start-up goes: build the engine as bench does, time Triton compiles,
autotune benchmarking and torch.compile, print the spans."""
import collections
import functools
import logging
import sys
import time

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
spent = collections.Counter()
calls = collections.Counter()


def timed(owner, name, label):
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


import triton.compiler.compiler as tc  # noqa: E402
import triton.runtime.autotuner as ta  # noqa: E402
import triton.runtime.jit as tj  # noqa: E402

timed(ta.Autotuner, "_bench", "triton autotune bench (per config)")
timed(tc, "compile", "triton compile (this process)")
timed(tj.JITFunction, "_do_compile", "triton jit _do_compile (cache hit or miss)")
from resident.config import build_engine_config, model_yaml_knobs, parse_set_options  # noqa
from resident.engine.engine import build_engine  # noqa
from resident.model.config import load_model_config  # noqa

knobs = sys.argv[1:] or ["attention_backend=triton", "resident_planning=auto"]
model = load_model_config("qwen3.5-0.8b")
config = build_engine_config(model_yaml_knobs("qwen3.5-0.8b"), None, parse_set_options(knobs))
started = time.perf_counter()
engine = build_engine(model, config, "cuda")
print("TOTAL build_engine", round(time.perf_counter() - started, 1), engine.startup.line())
for label, seconds in spent.items():
    print(f"SPENT {label}: {seconds:.1f} s in {calls[label]} calls")
import torch._dynamo.utils as du  # noqa: E402
print(du.compile_times(repr="str"))
