"""GPU time of a GDN layer's decode at the 0.8B's heads (16 key and 16 value heads of 128, conv
width 4, bf16, fp32 state): the fused layer kernel (kernels/gdn_layer_decode.py) by a program's
value columns (`block_dv`: 64 programs a row at the engine's 32, 128 at 16, 256 at 8), warps and
register cap (`max_registers`: how many programs an SM holds), against the separate kernels the
engine runs above FUSED_GDN_MAX_ROWS (`sep`: the conv update, the delta rule at block_dv_for's
tile, Inductor's gated norm), each captured as a CUDA graph as a decode bucket replays it. At
c=1 the fused layer took 6.1 µs a call with PDL off on an H100, for ~1 MB of state read and
written (results/2026-12-06-h100-decode-splits); at 16 rows 16.3 µs against ~9.6 to stream its
32 MB. Every config's output is checked against the first's (bf16 rounding apart):
    python3 tests/gpu/time_gdn_layer.py [--rows 1,4,8,16] [--configs 32x4,32x4r168,...]
A config is <block_dv>x<warps>, r<registers> for a cap; `sep` the separate kernels."""

from __future__ import annotations

import argparse
import functools

import torch

from resident.kernels.gdn_decode import causal_conv_decode, gated_delta_rule_decode
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
from resident.model.dense import gated_rms_norm
from resident.tool_args import counts
from resident.tools.bench_attention import graph_time_us

SHAPE = GdnShape(num_k_heads=16, num_v_heads=16, k_dim=128, v_dim=128)
WIDTH = 4
# The engine's tile first, then its tile capped. Launched here ptxas's own count is 121 a
# thread (four programs an SM), CAPPED_REGISTERS 168 allocates 136 (three), 128 allocates 124
# (four; resident.tools.compile_check compiles them as launched)
DEFAULT_CONFIGS = (f"{BLOCK_DV}x{NUM_WARPS}", f"{BLOCK_DV}x{NUM_WARPS}r{CAPPED_REGISTERS}",
                   f"{BLOCK_DV}x{NUM_WARPS}r128", f"16x4r{CAPPED_REGISTERS}", "64x4", "64x8")
SEPARATE = "sep"


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


def separate_layer(projected, weights, conv_pool, state_pool, slots, norm):
    """The engine's decode GDN layer without gdn_layer: conv, delta rule, gated norm."""
    rows = projected.shape[0]
    mixed, z, b, a = projected.split(SHAPE.split, dim=-1)
    loc = torch.empty(0, device=projected.device)  # unused by decode kernels
    q, k, v = causal_conv_decode(mixed, weights.conv_weight, conv_pool, slots, loc, 1).split(
        [SHAPE.key_dim, SHAPE.key_dim, SHAPE.value_dim], dim=-1)
    out = gated_delta_rule_decode(
        q.view(rows, SHAPE.num_k_heads, SHAPE.k_dim),
        k.view(rows, SHAPE.num_k_heads, SHAPE.k_dim),
        v.view(rows, SHAPE.num_v_heads, SHAPE.v_dim), a, b, state_pool, slots, loc, 1,
        gate_params=(weights.a_log, weights.dt_bias))
    return norm(out, z.view(rows, SHAPE.num_v_heads, SHAPE.v_dim), weights.norm_weight,
                weights.norm_eps)


def config_run(name: str, norm, projected, weights, conv_pool, state_pool, slots, scratch):
    """A call of the layer as `name` configures it, on its own copies of the pools (each
    config starts from the same state)."""
    conv_pool, state_pool = conv_pool.clone(), state_pool.clone()
    if name == SEPARATE:
        return functools.partial(separate_layer, projected, weights, conv_pool, state_pool,
                                 slots, norm)
    tile, _, registers = name.partition("r")
    block, warps = (int(part) for part in tile.split("x"))
    return functools.partial(gdn_layer_decode, projected, weights, conv_pool, state_pool, slots,
                             scratch, block_dv=block, num_warps=warps,
                             max_registers=int(registers or MAX_REGISTERS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=counts, default=(1, 4, 8, 16))
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    args = parser.parse_args()
    configs = args.configs.split(",")
    device = torch.device("cuda")
    norm = torch.compile(gated_rms_norm, dynamic=False)
    print(f"{'rows':>5} " + " ".join(f"{name + ' us':>14}" for name in configs)
          + "  max rel err against the first")
    for rows in args.rows:
        weights, conv_pool, state_pool, projected, slots = layer(rows, device)
        scratch = GdnLayerScratch(rows)
        times, outs = [], []
        args = (norm, projected, weights, conv_pool, state_pool, slots, scratch)
        for name in configs:
            times.append(graph_time_us(config_run(name, *args)))
            outs.append(config_run(name, *args)().float())
        worst = max(((out - outs[0]).norm() / outs[0].norm()).item() for out in outs)
        print(f"{rows:>5} " + " ".join(f"{t:>14.2f}" for t in times) + f"  {worst:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
