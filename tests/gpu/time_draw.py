"""GPU time of one batched draw (engine/draw.py) at the 0.8B vocabulary, each filter, captured
as a CUDA graph as the engine replays it, beside the greedy argmax alone: what sampling adds to a
decode step. Prints the argmax knob's two kernels' time per row count, one line per (rows,
sampler; the `triton` race also with its kernels launched with PDL), then the Triton race's
kernels at 64 rows:
    python3 tests/gpu/time_draw.py [SAMPLER ...]   (default: torch triton, and flashinfer if
    installed; FlashInfer JIT-builds its sampling module on a fresh machine, minutes)"""

from __future__ import annotations

import functools
import importlib.util
import sys

import torch

from resident.engine.draw import RowParams, draw, vocab_counters
from resident.tools.bench_attention import captured, graph_time_us

VOCAB = 248_320


def main() -> None:
    device = torch.device("cuda")
    counters = vocab_counters(VOCAB, device)
    samplers = sys.argv[1:] or ["torch", "triton"] + (
        ["flashinfer"] if importlib.util.find_spec("flashinfer") else [])
    for rows in (1, 16, 64, 256):
        logits = torch.randn(rows, VOCAB, device=device, dtype=torch.bfloat16) * 3
        params = RowParams(torch.full((rows,), 0.7, device=device),
                           torch.zeros(rows, dtype=torch.int64, device=device),
                           torch.full((rows,), 0.9, device=device),
                           torch.zeros(rows, device=device),
                           torch.arange(rows, dtype=torch.int64, device=device),
                           torch.zeros(rows, dtype=torch.int64, device=device))
        greedy_us = graph_time_us(lambda logits=logits: logits.argmax(dim=-1))
        print_argmax_us(logits, greedy_us)
        for sampler in samplers:
            greedy = logits.argmax(dim=-1)
            # fused: the filters' race on its Triton kernel, as the engine draws on CUDA; the
            # `triton` race with its kernels launched with PDL too (pdl=auto on Hopper)
            for pdl in (False, True) if sampler == "triton" else (False,):
                us = graph_time_us(lambda logits=logits, params=params, greedy=greedy,
                                   sampler=sampler, pdl=pdl: draw(
                                       logits, params, greedy, counters, sampler, fused=True,
                                       pdl=pdl))
                name = f"{sampler} (PDL)" if pdl else sampler
                print(f"rows {rows:4d} {name:14s} draw {us:8.1f} us "
                      f"(argmax alone {greedy_us:6.1f} us)", flush=True)
            if sampler == "triton" and rows == 64:
                run = functools.partial(draw, logits, params, greedy, counters, "triton",
                                        fused=True)
                print_kernels(run)
                print_host_us(run)
                print_launch_sizes(run)


def print_argmax_us(logits: torch.Tensor, torch_us: float) -> None:
    """The argmax knob's two choices, captured: torch's reduction against the Triton rows
    kernel (kernels/argmax.py) with and without PDL, its tokens checked against torch's."""
    from resident.kernels.argmax import RowsArgmax

    line = f"rows {logits.shape[0]:4d} argmax: torch {torch_us:6.1f} us"
    for pdl in (False, True):
        argmax = RowsArgmax(pdl=pdl)
        if not torch.equal(argmax(logits), logits.argmax(dim=-1)):
            raise AssertionError(f"RowsArgmax(pdl={pdl}) differs from torch.argmax")
        us = graph_time_us(lambda argmax=argmax: argmax(logits))
        line += f", triton{' (PDL)' if pdl else ''} {us:6.1f} us"
    print(line, flush=True)


def print_launch_sizes(run) -> None:
    """The race's time at other chunk and block sizes than nucleus_race.launch_sizes', and
    with its pivots counted from the round before nucleus_race.PIVOTS_FROM's, or the one after."""
    import triton

    from resident.kernels import nucleus_race

    shipped = nucleus_race.launch_sizes
    try:
        for chunk, block in ((8192, 1024), (4096, 512), (2048, 1024), (2048, 512),
                             (1024, 1024)):
            nucleus_race.launch_sizes = lambda vocab, chunk=chunk, block=block: (
                chunk, block, triton.next_power_of_2(-(-vocab // chunk)))
            print(f"    chunk {chunk:5d} block {block:4d}: {graph_time_us(run):8.1f} us",
                  flush=True)
    finally:
        nucleus_race.launch_sizes = shipped
    shipped = nucleus_race.PIVOTS_FROM
    try:
        for first in (shipped - 1, shipped, shipped + 1):
            nucleus_race.PIVOTS_FROM = first
            print(f"    pivots from round {first}: {graph_time_us(run):8.1f} us", flush=True)
    finally:
        nucleus_race.PIVOTS_FROM = shipped


def print_host_us(run, calls: int = 50) -> None:
    """The host's µs a call: `run` launched eagerly (what a varlen step's draw cost before it
    had graphs) against one replay of a graph holding it, the GPU kept busy behind both so
    that neither waits on it."""
    import time

    for name, call in (("eager", run), ("graph replay", captured(run).replay)):
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU spin (cycles): the host runs ahead
        started = time.perf_counter()
        for _ in range(calls):
            call()
        host_us = (time.perf_counter() - started) * 1e6 / calls
        torch.cuda.synchronize()
        print(f"    host {name}: {host_us:8.1f} us a call", flush=True)


def print_kernels(run) -> None:
    """Each kernel's GPU time in one call of `run` (eager launches, profiled over 20 calls)."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    calls = 20
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    for event in sorted(prof.key_averages(), key=lambda e: -e.device_time_total):
        if event.device_time_total > 0:
            print(f"    {event.device_time_total / calls:8.1f} us  {event.count // calls:3d} x "
                  f"{event.key[:70]}", flush=True)
    # the last call's kernels in launch order, each round apart (a listing only: the profiler's
    # event fields differ across torch versions)
    try:
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        last = kernels[-(len(kernels) // calls):]
        print("    last call: " + ", ".join(f"{e.name[:14]} {e.device_time_total:.1f}"
                                            for e in last), flush=True)
    except (AttributeError, ZeroDivisionError) as error:
        print(f"    last call: not listed ({error})", flush=True)


if __name__ == "__main__":
    main()
