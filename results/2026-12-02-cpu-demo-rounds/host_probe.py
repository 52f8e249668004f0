"""How steady each CPU of this host is right now: one process pinned to the CPU multiplies two
256x256 fp32 matrices in a loop (one torch thread) for `seconds`, counting products in each
0.1 s window; prints the mean count a window and its coefficient of variation. Run before a
demo session to see the state of the host it ran on.

    python results/2026-12-02-cpu-demo-rounds/host_probe.py [SECONDS]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

WINDOW_S = 0.1


def windows(cpu: int, seconds: float) -> list[int]:
    os.sched_setaffinity(0, {cpu})
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    counts = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start, count = time.monotonic(), 0
        while time.monotonic() - start < WINDOW_S:
            a @ b
            count += 1
        counts.append(count)
    return counts


def main(seconds: float) -> None:
    torch.set_num_threads(1)
    for cpu in sorted(os.sched_getaffinity(0)):
        counts = windows(cpu, seconds)
        mean = statistics.fmean(counts)
        print(f"cpu{cpu}: {mean:.0f} products a {WINDOW_S} s window, "
              f"cv {statistics.pstdev(counts) / mean:.3f} over {len(counts)} windows")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 8.0)
