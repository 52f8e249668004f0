"""Host phases of prefix-hit requests' steps, in process: where a hit's step spends the host's
time before its forward (the engine's phase timing, engine/phases.py).

    python -m resident.tools.hit_phases [MODEL] [--device cpu] [--prefix-len 1024]
        [--prompt-len 256] [--output-len 4] [--requests 20] [--set knob=value ...]

One request at a time (c=1), each the same shared prefix plus its own random tokens, greedy:
after `--warmup` requests (the second of which leaves the prefix snapshotted, engine/prefix.py)
the phases are reset and `--requests` more run. Knobs: the prefix cache and phase timing on
(on CPU also float32, no compile, padded prefill), over the model's YAML and the environment;
--set over those. Prints each step kind's ms a step by phase
(thread CPU; `step` and `event_sync` wall) and the hits. On CPU the `gpu` role is the forward
itself; `main` and `plan` are the host's work wherever it runs.
"""

from __future__ import annotations

import argparse
import random
import sys

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
    hits}} (a hit restores the prefix: every measured request should)."""
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    shared = [rng.randrange(vocab) for _ in range(prefix_len)]
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    for number in range(warmup + requests):
        if number == warmup:
            engine.phases.reset()
            hits_before = engine.prefixes.stats()["hits"]
        own = [rng.randrange(vocab) for _ in range(prompt_len)]
        engine.add_request(EngineRequest(f"hit-{number}", shared + own, params))
        while engine.has_work():
            engine.step()
    return {"phases": engine.phases.report(),
            "hits": {"requests": requests,
                     "hits": engine.prefixes.stats()["hits"] - hits_before}}


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
    render({"phases": phases, "hits": result["hits"]}, OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
