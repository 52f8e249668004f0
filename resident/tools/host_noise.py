"""How much this host's speed moves from one moment to the next, on one CPU at a time.

    python -m resident.tools.host_noise [--seconds 20] [--cpus 1] [--format table|json]

Run it before trusting a CPU gate (the README's demo) on a shared machine. Two loops, each pinned
to one CPU with one torch thread, count their iterations in 25 ms windows:

- `matmul`: 256x256 fp32 products, compute-bound: what a host probe usually runs;
- `smallops`: a chain of small ops on one 256-wide row, like a tiny model's decode step (bound by
  dispatch and cache, like the demo's engine).

For windows of 25 ms to 0.8 s each row gives the coefficient of variation of the count (`cv`),
the sd of the log ratio of two back-to-back windows (`adjacent_sd`: what pairing two runs of
that length leaves), and that sd times sqrt(window) (the noise of a paired comparison per unit of
time measured: shorter runs win while it falls with the window). On the project's 2-vCPU VM
(results/2026-12-02-cpu-demo-short-runs) `smallops` read an adjacent sd of ~11% at every window
from 25 ms to 0.8 s against 3-6% for `matmul`: the demo's effect (~11%) is the same size, which is
why the demo pairs many short runs.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

from resident.render import OutputFormat, render
from resident.tool_args import add_format

BASE_S = 0.025
WINDOWS = (1, 2, 4, 8, 16, 32)  # in BASE_S


def matmul_loop() -> Callable[[], object]:
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    return lambda: a @ b


def smallops_loop() -> Callable[[], object]:
    weights, row = [torch.randn(256, 256) for _ in range(8)], torch.randn(1, 256)

    def step() -> torch.Tensor:
        y = row
        for w in weights:
            y = torch.nn.functional.layer_norm(y, (256,))
            y = torch.nn.functional.silu(y @ w)
            y = y * 0.5 + y
        return y
    return step


WORKLOADS: dict[str, Callable[[], Callable[[], object]]] = {
    "matmul": matmul_loop, "smallops": smallops_loop}


def window_counts(step: Callable[[], object], seconds: float,
                  base_s: float = BASE_S) -> list[int]:
    """Iterations of `step` in each `base_s` window, for `seconds`."""
    counts = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start, count = time.monotonic(), 0
        while time.monotonic() - start < base_s:
            step()
            count += 1
        counts.append(count)
    return counts


def noise_rows(counts: list[int], base_s: float = BASE_S,
               windows: tuple[int, ...] = WINDOWS) -> list[dict[str, float]]:
    """One row per window length (k base windows summed) with at least two adjacent pairs."""
    rows = []
    for k in windows:
        logs = [math.log(sum(counts[i:i + k])) for i in range(0, len(counts) - k + 1, k)]
        diffs = [b - a for a, b in zip(logs[::2], logs[1::2], strict=False)]
        if len(diffs) < 2:
            continue
        adjacent = statistics.stdev(diffs)
        rows.append({"window_s": round(base_s * k, 3),
                     "cv_pct": round(100 * statistics.stdev(logs), 1),
                     "adjacent_sd_pct": round(100 * adjacent, 1),
                     "x_sqrt_window": round(100 * adjacent * math.sqrt(base_s * k), 2)})
    return rows


def measure(cpu: int, seconds: float) -> list[dict[str, object]]:
    """Both workloads on `cpu`, `seconds` each; the calling thread stays pinned to it."""
    os.sched_setaffinity(0, {cpu})
    rows: list[dict[str, object]] = []
    for name, make in WORKLOADS.items():
        for row in noise_rows(window_counts(make(), seconds)):
            rows.append({"cpu": cpu, "workload": name, **row})
    return rows


def _cpus(text: str) -> list[int]:
    allowed = sorted(os.sched_getaffinity(0))
    if text == "all":
        return allowed
    cpus = [int(part) for part in text.split(",")]
    if not set(cpus) <= set(allowed):
        raise ValueError(f"CPUs {sorted(set(cpus) - set(allowed))} are not allowed here "
                         f"(allowed: {allowed})")
    return cpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per workload and CPU")
    parser.add_argument("--cpus", default=str(max(os.sched_getaffinity(0))),
                        help="comma-separated CPU ids, or 'all' (default: the last allowed)")
    add_format(parser)
    args = parser.parse_args(argv)
    try:
        cpus = _cpus(args.cpus)
    except ValueError as error:
        parser.error(f"--cpus {args.cpus!r}: {error}")
    if args.seconds <= 2 * BASE_S * 2:
        parser.error("--seconds must be above 0.1")
    threads, before = torch.get_num_threads(), os.sched_getaffinity(0)
    torch.set_num_threads(1)
    try:
        rows = [row for cpu in cpus for row in measure(cpu, args.seconds)]
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
    render({"host_noise": rows}, OutputFormat(args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
