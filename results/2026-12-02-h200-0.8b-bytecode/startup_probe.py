"""Where a warm engine start goes on the H200 (run by startup_probe.sh from the tree's root):
python3 startup_probe.py [--imports] [--cprofile FILE]

--imports: time importing torch, the engine, fla's pieces and flashinfer, and stop; otherwise
build the 0.8B engine as the engine core does and print its start-up spans (the `imports` span
from this script's first line), under cProfile with --cprofile."""

import time

STARTED = time.perf_counter()

import cProfile  # noqa: E402 - the clock starts before every import
import importlib  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import sys  # noqa: E402


def timed_imports(*names: str) -> float:
    start = time.perf_counter()
    for name in names:
        importlib.import_module(name)
    return time.perf_counter() - start


def main() -> None:
    profiler = cProfile.Profile() if "--cprofile" in sys.argv else None
    if profiler:
        profiler.enable()
    torch_s = timed_imports("torch")
    resident_s = timed_imports("resident.config", "resident.engine.engine",
                               "resident.engine.startup", "resident.model.config",
                               "resident.server.core")
    print(f"import torch {torch_s:.2f} s, resident {resident_s:.2f} s", flush=True)
    if "--imports" in sys.argv:
        fla_s = timed_imports("resident.backends.gdn_prefill", "fla.ops.utils",
                              "fla.ops.gated_delta_rule.chunk")
        print(f"fla {fla_s:.2f} s, flashinfer {timed_imports('flashinfer'):.2f} s", flush=True)
        return
    import torch

    from resident.config import build_engine_config, model_yaml_knobs
    from resident.engine.engine import Engine
    from resident.engine.startup import StartupTimes
    from resident.model.config import load_model_config

    model = load_model_config("qwen3.5-0.8b")
    config = build_engine_config(model_yaml_knobs("qwen3.5-0.8b"), None, {})
    clock = StartupTimes()
    clock._started = clock._last = STARTED
    clock.lap("imports")
    Engine(model, config.resolve(model, "cuda"), torch.device("cuda"), clock)
    print(clock.line(), flush=True)
    if profiler:
        profiler.disable()
        with open(sys.argv[sys.argv.index("--cprofile") + 1], "w") as file:
            for key in ("cumulative", "tottime"):
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(90)
                file.write(text.getvalue())


if __name__ == "__main__":
    main()
