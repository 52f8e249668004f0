"""`resident serve` whose engine core skips the decode forward: the API process alone at the
token rates of a GPU, on any host (issue 35: where a streamed token's API microseconds go).

    python -m resident.tools.synthetic_core MODEL [--step-ms 0] [resident serve options]

The server is the real one (API processes, ZMQ pipes, the engine core's loop, scheduler,
planner and sampler, prefill on the model); only a decode bucket's forward is replaced: it
returns zero logits and, as a decode graph's in-graph argmax, token ids drawn from the model's
vocabulary (a fixed table, so no step draws random numbers), after sleeping `--step-ms`
milliseconds (0: as fast as the core's host work goes). On the tiny CPU model a decode step then
costs the core its host work alone (~0.3-1 ms at c=64), so the API sees tens of thousands of
tokens a second, as it does on the H200, where the tiny model's real forward would hold it
to hundreds. `gate.tools.api_profile --synthetic-decode` launches it.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable

TOKEN_TABLE_ROWS = 4096  # steps of token ids before the table repeats


def synthetic_decode(vocab_size: int, max_rows: int, step_ms: float
                     ) -> Callable[[int, int], object]:
    """A forward_decode (engine/runner.py) that computes nothing: [bucket, vocab] zero
    logits and each row's "argmax" from a table of random ids, after `step_ms`."""
    # here, not at the top: the API process imports this module, and like the real server's
    # it must not import torch (its heap, its threads, its CPU a token)
    import torch

    from resident.engine.sampler import StepLogits

    generator = torch.Generator().manual_seed(0)
    # [TOKEN_TABLE_ROWS, max_rows]; ids >= 256 leave out the tiny model's byte tokens' EOS-like
    # control bytes (low ids), so streams read as text and run to max_tokens
    table = torch.randint(256, vocab_size, (TOKEN_TABLE_ROWS, max_rows), generator=generator)
    logits = torch.zeros(max_rows, vocab_size)
    steps = itertools.cycle(range(TOKEN_TABLE_ROWS))

    def forward_decode(bucket: int, width: int) -> StepLogits:
        if step_ms > 0:
            time.sleep(step_ms / 1e3)
        return StepLogits(logits[:bucket], table[next(steps), :bucket])

    return forward_decode


def run_synthetic_core(*args, **kwargs) -> None:
    """The engine core's entry point (server/core.run_engine_core) with its engine's decode
    forward replaced; spawned by `resident serve` in place of the real one."""
    from resident.server import core

    build = core.build_core_engine
    step_ms = float(kwargs.pop("step_ms", 0.0))

    def build_synthetic(*build_args, **build_kwargs):
        engine = build(*build_args, **build_kwargs)
        engine.runner.forward_decode = synthetic_decode(
            engine.model_config.vocab_size, max(engine.config.decode_buckets), step_ms)
        return engine

    core.build_core_engine = build_synthetic
    core.run_engine_core(*args, **kwargs)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import functools

    from resident.cli import app
    from resident.server import serve

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Other options go to `resident serve`.")
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="each decode step's sleep, ms (0: none)")
    args, serve_args = parser.parse_known_args(argv)
    if args.step_ms < 0:
        parser.error(f"--step-ms must be >= 0, got {args.step_ms}")
    serve.run_engine_core = functools.partial(run_synthetic_core, step_ms=args.step_ms)
    app(args=["serve", *serve_args], prog_name="resident")  # exits with serve's code
    return 0


if __name__ == "__main__":
    sys.exit(main())
