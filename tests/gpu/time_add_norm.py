"""GPU time of a decode block's add + RMSNorm: Inductor's DenseOps.add_rms_norm (compiled as
the engine compiles it, PDL on) against kernels/add_norm.py with and without PDL, on a finished
bf16 [T, H] or fp32 split-K partials [S, T, H] at the 0.8B-9B hidden sizes; each op captured
20 times in one graph (back to back: what a call costs alone, not what it leaves exposed in a
step), the median of 15 replays. On an H100 the kernel took 1.4-2.7 µs a one-row call at
2,048-4,096 columns against Inductor's 1.9-5.8, and lost at the 0.8B's 1,024, where
Inductor's is a persistent reduction (results/2026-12-07-h100-add-norm):
    python3 tests/gpu/time_add_norm.py"""

from __future__ import annotations

from functools import partial

import torch

from resident.kernels.add_norm import add_rms_norm
from resident.model.dense import build_dense_ops
from resident.tools.bench_attention import graph_time_us

SHAPES = ((1024, 0), (1024, 4), (2048, 0), (2048, 4), (2048, 8), (4096, 0), (4096, 4), (4096, 8))
ROWS = (1, 16)


def main() -> None:
    # one compiled function meets every shape here, each its own graph
    torch._dynamo.config.recompile_limit = 64
    dense = build_dense_ops(True, pdl=True)
    print("hidden splits rows | inductor | kernel pdl | kernel | µs a call")
    for hidden, num_splits in SHAPES:
        for num_rows in ROWS:
            shape = (num_splits, num_rows, hidden) if num_splits else (num_rows, hidden)
            x = torch.randn(shape, device="cuda",
                            dtype=torch.float32 if num_splits else torch.bfloat16)
            residual = torch.randn(num_rows, hidden, device="cuda", dtype=torch.bfloat16)
            weight = 0.1 * torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
            args = (x, residual, weight, 1e-6)
            ops = (dense.add_rms_norm, partial(add_rms_norm, pdl=True), add_rms_norm)
            times = [graph_time_us(partial(op, *args)) for op in ops]
            print(hidden, num_splits, num_rows, "|", " | ".join(f"{t:.2f}" for t in times),
                  flush=True)


if __name__ == "__main__":
    main()
