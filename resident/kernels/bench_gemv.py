"""Skinny decode GEMMs: the Triton kernel (resident/kernels/gemv.py) against cuBLAS (F.linear).

    python -m resident.kernels.bench_gemv [--model qwen3.5-0.8b] [--rows 1,4,16] [--json FILE]

The shapes are the model's fused projections and its lm_head; each call is replayed inside a
CUDA graph (resident.kernels.bench.graph_time_us), bf16. GB/s counts the weight bytes only.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from resident.kernels.bench import graph_time_us
from resident.kernels.gemv import skinny_linear
from resident.model.config import ModelConfig, load_model_config

TILES = ((16, 256), (32, 256), (64, 128))  # (block_n, block_k)


def projection_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(N, K) of each fused projection a decode step runs."""
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
        "lm_head": (config.vocab_size, hidden),
    }


def bench_shape(name: str, n: int, k: int, rows: int) -> dict:
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    cublas = graph_time_us(lambda: F.linear(x, weight))
    tiles = {f"{bn}x{bk}": graph_time_us(lambda bn=bn, bk=bk: skinny_linear(
        x, weight, block_n=bn, block_k=bk)) for bn, bk in TILES}
    best = min(tiles, key=tiles.get)
    gbytes = 2 * n * k / 1e9
    return {"shape": name, "n": n, "k": k, "rows": rows, "cublas_us": round(cublas, 2),
            "triton_us": {t: round(us, 2) for t, us in tiles.items()}, "best_tile": best,
            "cublas_tb_s": round(gbytes * 1e3 / cublas, 2),
            "triton_tb_s": round(gbytes * 1e3 / tiles[best], 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3.5-0.8b")
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("resident.kernels.bench_gemv needs a CUDA device", file=sys.stderr)
        return 2
    shapes = projection_shapes(load_model_config(args.model))
    results = []
    print(f"{'shape':>12} {'M':>3} {'cublas us':>10} {'best triton us':>15} {'tile':>7} "
          f"{'cublas TB/s':>12} {'triton TB/s':>12}")
    for rows in (int(r) for r in args.rows.split(",")):
        for name, (n, k) in shapes.items():
            row = bench_shape(name, n, k, rows)
            results.append(row)
            print(f"{name:>12} {rows:>3} {row['cublas_us']:>10} "
                  f"{row['triton_us'][row['best_tile']]:>15} {row['best_tile']:>7} "
                  f"{row['cublas_tb_s']:>12} {row['triton_tb_s']:>12}", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
