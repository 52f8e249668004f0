"""How this host's speed moves, seen by two workloads pinned to one CPU (one torch thread):
`matmul`, 256x256 fp32 products (compute-bound, what a host probe usually runs), and `smallops`,
a chain of small ops on a (1, 256) row like a tiny model's decode step (dispatch- and
cache-bound, like the demo's engine). Each loop counts its iterations in 25 ms windows; for
windows of 25 ms to 0.8 s the script prints the coefficient of variation of the count and the
sd of the log ratio of adjacent windows (what pairing two runs of that length back to back
leaves), and that sd times sqrt(window): the noise of a paired comparison per unit of time,
which shorter runs make smaller when the adjacent sd does not grow as the window shrinks.

    python results/2026-12-02-cpu-demo-short-runs/host_noise.py [SECONDS] [CPU]
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

import torch

BASE_S = 0.025
WINDOWS = (1, 2, 4, 8, 16, 32)  # in BASE_S


def _matmul():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    return lambda: a @ b


def _smallops():
    weights, row = [torch.randn(256, 256) for _ in range(8)], torch.randn(1, 256)

    def step():
        y = row
        for w in weights:
            y = torch.nn.functional.layer_norm(y, (256,))
            y = torch.nn.functional.silu(y @ w)
            y = y * 0.5 + y
        return y
    return step


def counts(step, seconds: float) -> list[int]:
    result = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start, count = time.monotonic(), 0
        while time.monotonic() - start < BASE_S:
            step()
            count += 1
        result.append(count)
    return result


def report(name: str, base: list[int]) -> None:
    for k in WINDOWS:
        logs = [math.log(sum(base[i:i + k])) for i in range(0, len(base) - k + 1, k)]
        diffs = [b - a for a, b in zip(logs[::2], logs[1::2], strict=False)]
        if len(diffs) < 2:
            continue
        adjacent = statistics.stdev(diffs)
        print(f"{name:8s} window {BASE_S * k:5.3f} s: cv {100 * statistics.stdev(logs):5.1f}%, "
              f"adjacent windows' log ratio sd {100 * adjacent:5.1f}%, "
              f"x sqrt(window) {100 * adjacent * math.sqrt(BASE_S * k):5.2f}")


def main(seconds: float, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    print(f"cpu{cpu}, {seconds:.0f} s a workload")
    for name, make in (("matmul", _matmul), ("smallops", _smallops)):
        report(name, counts(make(), seconds))


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0,
         int(sys.argv[2]) if len(sys.argv) > 2 else max(os.sched_getaffinity(0)))
