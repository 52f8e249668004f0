"""Skinny decode GEMMs: the Triton kernel (resident/kernels/gemv.py) against cuBLAS (F.linear).

    python -m resident.tools.bench_gemv [--model qwen3.5-0.8b] [--rows 1,4,16] [--json FILE]

The shapes are the model's fused projections. A decode step reads each weight once from HBM, so
every timed call cycles through copies of the weight that together hold more than COLD_BYTES
(several times the H200's 50 MB L2); the calls are replayed inside a CUDA graph
(bench_attention.graph_time_us), bf16. Each shape sweeps TILES at the first row count and
times the best tile and cuBLAS at every row count; a tile whose pipeline does not fit in shared
memory is skipped (named on stderr). TB/s counts the weight bytes only.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from resident.kernels.gemv import GemvTile, skinny_linear
from resident.model.config import ModelConfig, load_model_config
from resident.tools.bench_attention import graph_time_us
from resident.tools.bench_io import require_cuda, write_json

COLD_BYTES = 256 << 20
SMEM_BYTES = 160 << 10  # a pipelined tile set above this does not fit beside the H200's L1
STAGES = 4
TILES = tuple(GemvTile(block_n, block_k, 8 if block_n * block_k >= 32768 else 4, STAGES, target,
                       unroll)
              for block_n, block_k, target, unroll in itertools.product(
                  (16, 32, 64), (128, 256, 512), (0, 264), (1, 4))
              if STAGES * (16 + block_n) * block_k * 2 <= SMEM_BYTES)


def projection_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(N, K) of each fused projection a decode step runs, lm_head aside."""
    hidden = config.hidden_size
    q_dim = config.num_attention_heads * config.head_dim
    kv_dim = config.num_key_value_heads * config.head_dim
    return {
        "gdn in_proj": (config.conv_dim + config.linear_value_dim
                        + 2 * config.linear_num_value_heads, hidden),
        "gdn out_proj": (hidden, config.linear_value_dim),
        "attn qkv": (2 * q_dim + 2 * kv_dim, hidden),
        "attn o_proj": (hidden, q_dim),
        "mlp gate_up": (2 * config.intermediate_size, hidden),
        "mlp down": (hidden, config.intermediate_size),
    }


def cold_time_us(linear, x: torch.Tensor, weights: list[torch.Tensor]) -> float:
    """GPU time of one call, each call reading a weight the L2 does not hold."""
    def run():
        for weight in weights:
            linear(x, weight)
    return graph_time_us(run) / len(weights)


def sweep_time_us(tile: GemvTile, x: torch.Tensor, weights: list[torch.Tensor]) -> float | None:
    """cold_time_us of one tile, or None where its pipeline does not fit in shared memory."""
    try:
        return cold_time_us(lambda a, w: skinny_linear(a, w, tile), x, weights)
    except OutOfResources as err:
        print(f"skip {tile_name(tile)}: {err}", file=sys.stderr)
        return None


def tile_name(tile: GemvTile) -> str:
    return (f"{tile.block_n}x{tile.block_k} w{tile.num_warps} s{tile.num_stages} "
            f"p{tile.target_programs} u{tile.unroll}")


def bench_shape(name: str, n: int, k: int, rows: list[int]) -> list[dict]:
    copies = max(1, -(-COLD_BYTES // (2 * n * k)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
               for _ in range(copies)]
    sweep_x = torch.randn(rows[0], k, device="cuda", dtype=torch.bfloat16)
    sweep = {tile: sweep_time_us(tile, sweep_x, weights) for tile in TILES}
    sweep = {tile: us for tile, us in sweep.items() if us is not None}
    best = min(sweep, key=sweep.get)
    gbytes = 2 * n * k / 1e9
    results = []
    for num_rows in rows:
        x = torch.randn(num_rows, k, device="cuda", dtype=torch.bfloat16)
        cublas = cold_time_us(F.linear, x, weights)
        triton_us = cold_time_us(lambda a, w: skinny_linear(a, w, best), x, weights)
        results.append({
            "shape": name, "n": n, "k": k, "rows": num_rows, "best_tile": tile_name(best),
            "tile": best.__dict__, "cublas_us": round(cublas, 2), "triton_us": round(triton_us, 2),
            "cublas_tb_s": round(gbytes * 1e3 / cublas, 2),
            "triton_tb_s": round(gbytes * 1e3 / triton_us, 2),
            "sweep_us": {tile_name(t): round(us, 2) for t, us in sweep.items()}
            if num_rows == rows[0] else None,
        })
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3.5-0.8b")
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    if not require_cuda("resident.tools.bench_gemv"):
        return 2
    rows = [int(r) for r in args.rows.split(",")]
    results = []
    print(f"{'shape':>12} {'M':>3} {'cublas us':>10} {'triton us':>10} {'best tile':>22} "
          f"{'cublas TB/s':>12} {'triton TB/s':>12}")
    for name, (n, k) in projection_shapes(load_model_config(args.model)).items():
        for row in bench_shape(name, n, k, rows):
            results.append(row)
            print(f"{name:>12} {row['rows']:>3} {row['cublas_us']:>10} {row['triton_us']:>10} "
                  f"{row['best_tile']:>22} {row['cublas_tb_s']:>12} {row['triton_tb_s']:>12}",
                  flush=True)
        write_json(args.json, results)  # after each shape: a killed sweep keeps its rows
    return 0


if __name__ == "__main__":
    sys.exit(main())
