"""Skinny decode GEMMs: the Triton kernel (resident/kernels/gemv.py) against cuBLAS (F.linear).

    python -m resident.tools.bench_gemv [--model qwen3.5-0.8b] [--rows 1,4,16] [--tiles all]
        [--pdl] [--json FILE]

The shapes are the model's fused projections. A decode step reads each weight once from HBM, so
every timed call cycles through copies of the weight that together hold more than COLD_BYTES
(several times the H200's 50 MB L2); the calls are replayed inside a CUDA graph
(bench_attention.graph_time_us), bf16. Each shape sweeps the tiles (`--tiles`: the MMA form's
DOT_TILES up to 16 rows and above them the WGMMA_TILES of the rows' class, the CUDA-core form's
FMA_TILES for rows up to FMA_MAX_ROWS, both, `wgmma`: the WGMMA_TILES at every row count, the
64-row ones at 1-16 rows, or `engine`: only the engine's own tiles, ENGINE_TILES, which every
sweep times) at each row count and times the best against
cuBLAS; a tile whose pipeline does not fit in shared memory is skipped (named on stderr). TB/s
counts the weight bytes only.

`--pdl` times the Triton tiles as a decode step launches them: each call under programmatic
dependent launch (its weight's L2 prefetch and its programs' start overlapping the call before). A
block's closing projection (CLOSING_PROJECTIONS) leaves its K splits' partial sums for the add +
norm after it, which adds them up; an opening one (in_proj, qkv, gate_up) feeds a kernel that reads
the finished product, so a tile that splits K is timed with its splits' sum, a kernel of its own,
as the step runs it (each row's `"partials"` says which; the chained sweeps of
results/2026-12-07-h200-table timed every shape without the sum). cuBLAS launches as before: it
takes no PDL, and in a step its kernel waits for the one before to finish. Alone the Triton GEMV
lost to cuBLAS at 128 and 256 rows yet shortened the steps of 24-128 rows
(results/2026-12-07-h100-pdl-chain). On an H100 the chain agreed with the steps at 1, 32 and 256
rows; at 128 it gives cuBLAS three projections a step A/B gave the Triton GEMV, not yet stepped
(results/2026-12-07-h100-gemv-chain). Each row records `"pdl"`.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.nn.functional as F
from triton.runtime.errors import OutOfResources

from resident.kernels.gemv import (
    DEFAULT_TILE,
    FMA_MAX_ROWS,
    MAX_ROWS,
    MIN_DOT,
    ROW_CLASSES,
    WIDE_TILE,
    GemvTile,
    row_class,
    skinny_linear,
    skinny_linear_partials,
)
from resident.kernels.pdl import pdl_available
from resident.model.config import load_model_config
from resident.tool_args import counts
from resident.tools.bench_attention import graph_time_us
from resident.tools.bench_io import require_cuda, write_json

COLD_BYTES = 256 << 20
SMEM_BYTES = 160 << 10  # a pipelined tile set above this does not fit beside the H200's L1
STAGES = 4
DOT_TILES = tuple(
    GemvTile(block_n, block_k, 8 if block_n * block_k >= 32768 else 4, STAGES, target, unroll)
    for block_n, block_k, target, unroll in itertools.product(
        (16, 32, 64), (128, 256, 512), (0, 264), (1, 4))
    if STAGES * (16 + block_n) * block_k * 2 <= SMEM_BYTES)
# a thread's fp32 accumulators at most in a wgmma tile: block_m x block_n over its threads
MAX_ACC_PER_THREAD = 64


def wgmma_tiles(block_m: int) -> tuple[GemvTile, ...]:
    """The tiles of a row class above 16 (block_m rows, gemv.ROW_CLASSES): a program's product
    is warpgroup MMA (wgmma) reading both operands from shared memory, where the 16-row form's
    mma.sync reads them from registers. 4 warps at 64 rows, 8 above; 4 pipeline stages, or 3
    where 4 do not fit. Alone on an H100 they beat cuBLAS on some shapes at 17-64 rows and on
    none at 128 or 256, yet every projection on them shortens a step of 24-128 rows (PDL;
    results/2026-12-07-h100-medium-gemv, results/2026-12-07-h100-pdl-chain)."""
    warps = 4 if block_m <= 64 else 8
    tiles = []
    for block_n, block_k, target in itertools.product((32, 64, 128), (64, 128), (0, 264)):
        stages = next((stages for stages in (STAGES, STAGES - 1)
                       if stages * (block_m + block_n) * block_k * 2 <= SMEM_BYTES), None)
        if stages and block_m * block_n <= MAX_ACC_PER_THREAD * 32 * warps:
            tiles.append(GemvTile(block_n, block_k, warps, stages, target, block_m=block_m))
    return tuple(tiles)


WGMMA_TILES = {block_m: wgmma_tiles(block_m) for block_m in ROW_CLASSES[1:]}
# each program's whole weight tile loaded at once (8-16 KB): the bytes in flight the MMA form's
# 8 KB tiles may lack. 8 tiles: each is a compile at every shape and row count (~1-2 s on the
# H200's host), and a sweep must fit a device call
FMA_TILES = tuple(GemvTile(block_n, block_k, 4, 3, target, fma=True)
                  for (block_n, block_k), target in itertools.product(
                      ((8, 512), (8, 1024), (16, 256), (16, 512)), (264, 528)))

# the narrow projections' tile and the wide ones' under decode_gemm=skinny / wide
ENGINE_TILES = (DEFAULT_TILE, WIDE_TILE)
# a block's closing projections (ModelConfig.decode_projections' names): in a decode step their
# K splits' partials go to the add + norm after them (qwen3_5.block_output), which sums them;
# the others open a block, and what reads them takes the finished product
CLOSING_PROJECTIONS = frozenset({"gdn out_proj", "attn o_proj", "mlp down"})


def cold_time_us(linear, x: torch.Tensor, weights: list[torch.Tensor]) -> float:
    """GPU time of one call, each call reading a weight the L2 does not hold."""
    def run():
        for weight in weights:
            linear(x, weight)
    return graph_time_us(run) / len(weights)


def sweep_time_us(tile: GemvTile, x: torch.Tensor, weights: list[torch.Tensor],
                  pdl: bool = False, partials: bool = False) -> float | None:
    """cold_time_us of one tile (pdl: launched as a step launches it, see --pdl; partials:
    its K splits left unsummed, as a closing projection's are), or None where its pipeline
    does not fit in shared memory."""
    def linear(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if partials:
            return skinny_linear_partials(a, w, tile, pdl=pdl)
        return skinny_linear(a, w, tile, pdl=pdl)
    try:
        return cold_time_us(linear, x, weights)
    except OutOfResources as err:
        print(f"skip {tile.name}: {err}", file=sys.stderr)
        return None


def tiles_for(kinds: str, num_rows: int) -> tuple[GemvTile, ...]:
    """The tiles `--tiles` (dot, fma, all, wgmma or engine) sweeps at num_rows rows, always
    with the tiles the engine runs without a table (ENGINE_TILES; `engine`: those alone): a
    table picks cuBLAS where the best swept tile lost to it, so a sweep of other tiles alone
    could hand a projection to cuBLAS where the engine's own tile beats both."""
    dot = ()
    if kinds in ("dot", "all"):
        dot = DOT_TILES if num_rows <= MIN_DOT else WGMMA_TILES[row_class(num_rows)]
    if kinds == "wgmma":
        dot = WGMMA_TILES[max(ROW_CLASSES[1], row_class(num_rows))]
    fma = FMA_TILES if kinds in ("fma", "all") and num_rows <= FMA_MAX_ROWS else ()
    return tuple(dict.fromkeys(ENGINE_TILES + dot + fma))


def bench_shape(name: str, n: int, k: int, rows: list[int], kinds: str,
                pdl: bool = False) -> list[dict]:
    """One projection (`name`, ModelConfig.decode_projections') at each row count: the swept
    tiles' cold µs (pdl: as a step launches them, a closing projection's K splits unsummed),
    the best of them and cuBLAS, one row a count."""
    copies = max(1, -(-COLD_BYTES // (2 * n * k)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
               for _ in range(copies)]
    gbytes = 2 * n * k / 1e9
    partials = pdl and name in CLOSING_PROJECTIONS
    results = []
    for num_rows in rows:
        x = torch.randn(num_rows, k, device="cuda", dtype=torch.bfloat16)
        sweep = {tile: sweep_time_us(tile, x, weights, pdl, partials)
                 for tile in tiles_for(kinds, num_rows)}
        sweep = {tile: us for tile, us in sweep.items() if us is not None}
        if not sweep:
            continue
        best = min(sweep, key=sweep.get)
        cublas = cold_time_us(F.linear, x, weights)
        results.append({
            "shape": name, "n": n, "k": k, "rows": num_rows, "pdl": pdl, "partials": partials,
            "best_tile": best.name,
            "tile": best.__dict__, "cublas_us": round(cublas, 2),
            "triton_us": round(sweep[best], 2), "cublas_tb_s": round(gbytes * 1e3 / cublas, 2),
            "triton_tb_s": round(gbytes * 1e3 / sweep[best], 2),
            "sweep_us": {t.name: round(us, 2) for t, us in sweep.items()},
        })
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3.5-0.8b")
    parser.add_argument("--rows", type=counts, default="1,4,16")
    parser.add_argument("--tiles", choices=("dot", "fma", "all", "wgmma", "engine"), default="all",
                        help="the tiles swept at each row count")
    parser.add_argument("--pdl", action="store_true",
                        help="the Triton tiles launched as in a decode step: under PDL, a "
                             "closing projection's K splits left unsummed (cuBLAS as without)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    rows = args.rows
    if max(rows) > MAX_ROWS:
        parser.error(f"--rows: the GEMV takes at most {MAX_ROWS} rows, got {max(rows)}")
    if not require_cuda("resident.tools.bench_gemv"):
        return 2
    if args.pdl and not pdl_available(torch.device("cuda")):
        parser.error("--pdl: this GPU has no programmatic dependent launch (compute capability "
                     "9.0 or later)")
    results = []
    print(f"{'shape':>12} {'M':>3} {'cublas us':>10} {'triton us':>10} {'best tile':>26} "
          f"{'cublas TB/s':>12} {'triton TB/s':>12}")
    benched: dict[tuple[int, int], str] = {}
    for name, (n, k) in load_model_config(args.model).decode_projections.items():
        if (n, k) in benched:  # the 0.8B's out_proj and o_proj are one shape
            print(f"{name:>12}     as {benched[n, k]}", flush=True)
            continue
        benched[n, k] = name
        for row in bench_shape(name, n, k, rows, args.tiles, args.pdl):
            results.append(row)
            print(f"{name:>12} {row['rows']:>3} {row['cublas_us']:>10} {row['triton_us']:>10} "
                  f"{row['best_tile']:>26} {row['cublas_tb_s']:>12} {row['triton_tb_s']:>12}",
                  flush=True)
        write_json(args.json, results)  # after each shape: a killed sweep keeps its rows
    return 0


if __name__ == "__main__":
    sys.exit(main())
