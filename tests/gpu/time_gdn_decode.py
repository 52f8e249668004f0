"""GPU time of the GDN decode delta rule (kernels/gdn_decode.py, the kernel of buckets above
FUSED_GDN_MAX_ROWS) at the 0.8B's heads (16 key and 16 value heads of 128, bf16 activations)
by the state's dtype (gdn_state_dtype: float32, bfloat16), a program's value columns
(`block_dv`: 4 programs a head at 32, 2 at 64) and warps, captured as a CUDA graph as a decode
bucket replays it, at 64 and 256 rows. On an H100 the c=256 step's 18 calls took 3,855 µs with
an fp32 state and 3,020 with a bf16 one at 32 columns: 75% and 48% of the copy bandwidth
(results/2026-12-06-h100-state-bf16, which this script's first run chose WIDE_BLOCK_DV from).
64 rows of bf16 state (34 MB) stay in an H100's L2 from one replay to the next: the 256-row
line is the one a step sees. Fewer rows stay warm too, so the rule below 64 rows was judged in
whole steps (results/2026-12-06-h100-wide-rows: the fp32 state's warm 24-row gain was a cold
step's loss). Each config's state after one step from the same start is checked
against the first config's (its dtype's rounding apart; that first run's error column compared
different starts, a bug since fixed, its times stand):
    python3 tests/gpu/time_gdn_decode.py [--rows 64,256]"""

from __future__ import annotations

import argparse
import functools

import torch

from resident.kernels.gdn_decode import (
    GDN_BLOCK_DV,
    GDN_NUM_WARPS,
    WIDE_BLOCK_DV,
    gated_delta_rule_decode,
)
from resident.tool_args import counts
from resident.tools.bench_attention import graph_time_us

HEADS, DIM = 16, 128
ROWS = (64, 256)
# (block_dv, num_warps): the engine's below WIDE_ROWS first, then its from WIDE_ROWS up
CONFIGS = ((GDN_BLOCK_DV, GDN_NUM_WARPS), (WIDE_BLOCK_DV, GDN_NUM_WARPS), (32, 8), (64, 8),
           (16, 4), (128, 8))


def inputs(rows: int, state_dtype: torch.dtype, device: torch.device):
    """q, k, v, raw gates a and b, A_log, dt_bias and a pool with a slot a row past the sink."""
    gen = torch.Generator().manual_seed(rows)

    def randn(*size, scale=1.0, dtype=torch.bfloat16):
        return (torch.randn(*size, generator=gen) * scale).to(device, dtype)

    q, k, v = (randn(rows, HEADS, DIM) for _ in range(3))
    a, b = randn(rows, HEADS), randn(rows, HEADS)
    a_log, dt_bias = randn(HEADS, dtype=torch.float32), randn(HEADS)
    pool = randn(rows + 1, HEADS, DIM, DIM, scale=0.1, dtype=state_dtype)
    slots = torch.arange(1, rows + 1, device=device)
    return (q, k, v, a, b), (a_log, dt_bias), pool, slots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=counts, default=",".join(map(str, ROWS)))
    rows_timed = parser.parse_args().rows
    device = torch.device("cuda")
    print(f"{'state':>9} {'rows':>5} " + " ".join(f"{f'{b}x{w}w us':>10}" for b, w in CONFIGS)
          + "  GB/s at the best  max rel err against the engine's")
    for state_dtype in (torch.float32, torch.bfloat16):
        for rows in rows_timed:
            tensors, gates, pool, slots = inputs(rows, state_dtype, device)
            qsl = torch.arange(rows + 1, device=device)
            start = pool.clone()  # every config's checked step starts here
            times, states = [], []
            for block_dv, warps in CONFIGS:
                run = functools.partial(gated_delta_rule_decode, *tensors, pool, slots, qsl, 1,
                                        gate_params=gates, block_dv=block_dv, num_warps=warps)
                pool.copy_(start)
                run()
                states.append(pool[1:].float().clone())
                times.append(graph_time_us(run))
            errors = [((s - states[0]).norm() / states[0].norm()).item() for s in states[1:]]
            moved = 2 * rows * HEADS * DIM * DIM * pool.element_size()
            print(f"{str(state_dtype)[6:]:>9} {rows:>5} "
                  + " ".join(f"{t:>10.1f}" for t in times)
                  + f"  {moved / min(times) / 1e3:>8.0f}  {max(errors):.1e}", flush=True)


if __name__ == "__main__":
    main()
