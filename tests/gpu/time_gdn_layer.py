"""GPU time of the fused GDN layer decode (kernels/gdn_layer_decode.py) at the 0.8B's heads (16
key and 16 value heads of 128, conv width 4, bf16, fp32 state) by a program's value columns
(`block_dv`: 64 programs a row at the engine's 32, 128 at 16, 256 at 8), warps and register cap
(`max_registers`: how many programs an SM holds), captured as a CUDA graph as a decode bucket
replays it, at 1, 4, 8 and 16 rows: at c=1 the layer took 6.1 µs a
call with PDL off on an H100, for ~1 MB of state read and written
(results/2026-12-06-h100-decode-splits), the shape of problem the decode attention's splits
had; at 16 rows 16.3 µs against ~9.6 to stream its 32 MB. Each other config is also checked
against the engine's (bf16 rounding apart):
    python3 tests/gpu/time_gdn_layer.py"""

from __future__ import annotations

import functools

import torch

from resident.kernels.gdn_layer_decode import (
    BLOCK_DV,
    CAPPED_REGISTERS,
    MAX_REGISTERS,
    NUM_WARPS,
    GdnLayerScratch,
    GdnLayerWeights,
    GdnShape,
    gdn_layer_decode,
)
from resident.tools.bench_attention import graph_time_us

SHAPE = GdnShape(num_k_heads=16, num_v_heads=16, k_dim=128, v_dim=128)
WIDTH = 4
ROWS = (1, 4, 8, 16)
# (block_dv, num_warps, max_registers): the engine's first, then its tile capped. Launched
# here ptxas's own count is 121 a thread (four programs an SM), CAPPED_REGISTERS 168 allocates
# 136 (three), 128 allocates 124 (four; resident.tools.compile_check compiles them as launched)
CONFIGS = ((BLOCK_DV, NUM_WARPS, MAX_REGISTERS), (BLOCK_DV, NUM_WARPS, CAPPED_REGISTERS),
           (BLOCK_DV, NUM_WARPS, 128), (16, 4, CAPPED_REGISTERS), (64, 4, 0), (64, 8, 0))


def layer(rows: int, device: torch.device):
    """Weights, pools (a slot a row past the sink) and an in_proj output for `rows` rows."""
    gen = torch.Generator().manual_seed(rows)

    def randn(*size, scale=1.0, dtype=torch.bfloat16):
        return (torch.randn(*size, generator=gen) * scale).to(device, dtype)

    weights = GdnLayerWeights(
        conv_weight=randn(SHAPE.conv_dim, WIDTH), a_log=randn(SHAPE.num_v_heads,
                                                              dtype=torch.float32),
        dt_bias=randn(SHAPE.num_v_heads), norm_weight=1 + randn(SHAPE.v_dim, scale=0.1),
        norm_eps=1e-6)
    conv_pool = randn(rows + 1, SHAPE.conv_dim, WIDTH)
    state_pool = randn(rows + 1, SHAPE.num_v_heads, SHAPE.k_dim, SHAPE.v_dim, scale=0.1,
                       dtype=torch.float32)
    projected = randn(rows, sum(SHAPE.split))
    slots = torch.arange(1, rows + 1, device=device)
    return weights, conv_pool, state_pool, projected, slots


def main() -> None:
    device = torch.device("cuda")
    print(f"{'rows':>5} " + " ".join(f"{f'{b}x{w}w r{r} us':>14}" for b, w, r in CONFIGS)
          + "  max rel err against the engine's")
    for rows in ROWS:
        weights, conv_pool, state_pool, projected, slots = layer(rows, device)
        scratch = GdnLayerScratch(rows)
        times, outs = [], {}
        for block, warps, registers in CONFIGS:
            config = {"block_dv": block, "num_warps": warps, "max_registers": registers}
            run = functools.partial(gdn_layer_decode, projected, weights, conv_pool.clone(),
                                    state_pool.clone(), slots, scratch, **config)
            times.append(graph_time_us(run))
            outs[block, warps, registers] = gdn_layer_decode(
                projected, weights, conv_pool.clone(), state_pool.clone(), slots, scratch,
                **config).float()
        want = outs[CONFIGS[0]]
        worst = max(((out - want).norm() / want.norm()).item() for out in outs.values())
        print(f"{rows:>5} " + " ".join(f"{t:>14.2f}" for t in times) + f"  {worst:.1e}")


if __name__ == "__main__":
    main()
