"""Host phases of prefix-hit requests' steps, in process: where a hit's step spends the host's
time before its forward (the engine's phase timing, engine/phases.py).

    python -m resident.tools.hit_phases [MODEL] [--device cpu] [--prefix-len 1024]
        [--prompt-len 256] [--output-len 4] [--requests 20] [--set knob=value ...]

One request at a time (c=1), each the same shared prefix plus its own random tokens, greedy
(with `--set prefix_cache=off`, every prompt computed whole: the TTFT the cache saves):
after `--warmup` requests (the second of which leaves the prefix snapshotted, engine/prefix.py)
the phases are reset and `--requests` more run. Knobs: the prefix cache and phase timing on
(on CPU also float32, no compile, padded prefill), over the model's YAML and the environment;
--set over those. Prints each step kind's ms a step by phase
(thread CPU; `step` and `event_sync` wall), the hits, and each measured request's TTFT in
process (wall, from `add_request` to the step that returns its first token: no HTTP, no pipe;
p50 and p90). On CPU the `gpu` role is the forward itself; `main` and `plan` are the host's
work wherever it runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

from resident.config import build_engine_config, model_yaml_knobs, parse_set_options
from resident.engine.engine import build_engine
from resident.engine.types import EngineRequest, SamplingParams
from resident.model.config import load_model_config
from resident.render import OutputFormat, render
from resident.tool_args import add_format, count
from resident.tools.bench_io import require_cuda

DEFAULT_KNOBS = {"prefix_cache": "on", "phase_timing": "on"}
CPU_KNOBS = {"dtype": "float32", "compile": "off", "padded_prefill": "on"}


def hit_phases(engine, prefix_len: int, prompt_len: int, output_len: int, warmup: int,
               requests: int, seed: int = 0) -> dict:
    """Runs the requests; returns {"phases": {kind: {phase: ms a step}}, "hits": {requests,
    hits}, "ttft_ms": {p50, p90}} (a hit restores the prefix: every measured request should)."""
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    shared = [rng.randrange(vocab) for _ in range(prefix_len)]
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    ttft_s = []
    for number in range(warmup + requests):
        if number == warmup:
            engine.phases.reset()
            hits_before = _hits(engine)
        own = [rng.randrange(vocab) for _ in range(prompt_len)]
        added_s = time.perf_counter()
        engine.add_request(EngineRequest(f"hit-{number}", shared + own, params))
        first_s = None
        while engine.has_work():
            outputs = engine.step()
            if first_s is None and any(output.new_token_ids for output in outputs):
                first_s = time.perf_counter()
        if number >= warmup and first_s is not None:
            ttft_s.append(first_s - added_s)
    return {"phases": engine.phases.report(),
            "hits": {"requests": requests,
                     "hits": _hits(engine) - hits_before},
            "ttft_ms": _percentiles_ms(ttft_s)}


def _hits(engine) -> int:
    return engine.prefixes.stats()["hits"] if engine.prefixes.enabled else 0


def _percentiles_ms(values_s: list[float]) -> dict[str, float | None]:
    """p50 and p90 in ms (None without values)."""
    if len(values_s) < 2:
        value = round(values_s[0] * 1e3, 3) if values_s else None
        return {"p50": value, "p90": value}
    deciles = statistics.quantiles(values_s, n=10)
    return {"p50": round(statistics.median(values_s) * 1e3, 3), "p90": round(deciles[8] * 1e3, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prefix-len", type=count, default=1024)
    parser.add_argument("--prompt-len", type=count, default=256)
    parser.add_argument("--output-len", type=count, default=4)
    parser.add_argument("--warmup", type=count, default=3)
    parser.add_argument("--requests", type=count, default=20)
    parser.add_argument("--set", dest="knobs", action="append", default=[])
    add_format(parser)
    args = parser.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device: expected a torch device (cpu, cuda, cuda:1), got "
                     f"{args.device!r}")
    if device.type == "cuda" and not require_cuda("resident.tools.hit_phases --device cuda"):
        return 2
    knobs = DEFAULT_KNOBS | (CPU_KNOBS if device.type == "cpu" else {})
    try:
        model = load_model_config(args.model)
        config = build_engine_config(model_yaml_knobs(args.model), None,
                                     knobs | parse_set_options(args.knobs))
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(1)
    engine = build_engine(model, config, device)
    result = hit_phases(engine, args.prefix_len, args.prompt_len, args.output_len,
                        args.warmup, args.requests)
    kinds = result["phases"]
    keys = dict.fromkeys(key for row in kinds.values() for key in row)
    phases = [{"phase": key} | {kind: round(row.get(key, 0.0), 3) for kind, row in kinds.items()}
              for key in keys]
    render({"phases": phases, "hits": result["hits"], "ttft_ms": result["ttft_ms"]},
           OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
