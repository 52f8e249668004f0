"""Decode attention kernel time: the Triton split-KV kernel against FlashInfer's fa2 decode.

    python -m resident.tools.bench_attention [--buckets 1,16,64,256] [--context 640]
        [--splits 8,16,32,64] [--block-n 16,32] [--json FILE]

Each kernel runs inside a CUDA graph of REPEAT back-to-back calls (the way a decode bucket runs
it), timed with CUDA events, so the time is the kernels' own plus the ~1 us a graph spends per
launch, and no Python. FlashInfer's host `plan` is timed separately (wall clock, median). Shapes
are the 0.8B model's (8 query heads over 2 kv heads of 256, bf16, pages of 16); each row has
`context` keys on distinct random pages. The Triton kernel runs at the key splits the engine
and tile the engine gives the bucket (`decode_tile`, decode_splits=auto), or with `--splits` at
each count given, and with `--block-n` at each tile of keys given (the kernel's warps follow
it), the first pair against fa2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial

import torch

from resident.backends.flashinfer import FlashInferDecode, HeadShape, flashinfer_workspace
from resident.backends.layout import paged_layout
from resident.kernels import device_sms
from resident.kernels.decode_attention import (
    decode_scratch,
    decode_tile,
    paged_decode_attention,
)
from resident.tool_args import count, counts
from resident.tools.bench_io import require_cuda, write_json

REPEAT, SAMPLES = 20, 15
HEADS, KV_HEADS, HEAD_DIM, PAGE = 8, 2, 256, 16


def captured(run, repeat: int = 1) -> torch.cuda.CUDAGraph:
    """A graph of `repeat` back-to-back calls of `run`, after one warm-up call on a side stream
    (compiles, tunes and allocates outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            run()
    return graph


def graph_time_us(run) -> float:
    """Median per-call GPU time of `run` replayed REPEAT times inside one graph."""
    graph = captured(run, REPEAT)
    times = []
    for _ in range(SAMPLES):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / REPEAT)
    return statistics.median(times)


def bench_bucket(batch: int, context: int, device: torch.device,
                 splits: tuple[int, ...] = (), block_ns: tuple[int, ...] = ()) -> dict:
    """One bucket's row: the Triton kernel at each of `splits` and each of `block_ns` (keys a
    tile; either not given: the engine's, decode_tile) against fa2, and fa2's host plan. Its
    times are keyed <splits>x<keys a tile>."""
    rule = decode_tile(batch, KV_HEADS, device_sms(device), HEAD_DIM)
    splits, block_ns = splits or (rule.num_splits,), block_ns or (rule.block_n,)
    pages_per_row = -(-context // PAGE)
    num_pages = batch * pages_per_row + 1
    kv = torch.randn(num_pages, 2, PAGE, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    order = torch.randperm(num_pages - 1).add(1).view(batch, pages_per_row)
    tables = order.to(device, torch.int32)
    positions = torch.full((batch,), context - 1, device=device, dtype=torch.int64)
    query = torch.randn(batch, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    scale = HEAD_DIM**-0.5

    out = torch.empty_like(query)
    by_splits = {}
    for block_n in block_ns:
        for num_splits in splits:
            run = partial(paged_decode_attention, query, kv, tables, None, positions, scale,
                          num_splits, out=out, block_n=block_n,
                          scratch=decode_scratch(batch, HEADS, HEAD_DIM, num_splits, device))
            by_splits[f"{num_splits}x{block_n}"] = round(graph_time_us(run), 2)
    triton_us = next(iter(by_splits.values()))

    heads = HeadShape(HEADS, KV_HEADS, HEAD_DIM, PAGE, torch.bfloat16)
    decode = FlashInferDecode(heads, flashinfer_workspace(device), (batch,), pages_per_row)
    layout = paged_layout([(row, context, 1) for row in order.tolist()], PAGE)
    plan_times = []
    for _ in range(SAMPLES):
        start = time.perf_counter()
        decode.plan_decode(batch, layout)
        plan_times.append((time.perf_counter() - start) * 1e6)
    attention = decode.ops(batch).attention
    fa2_us = graph_time_us(lambda: attention(query, kv, None, scale))
    want = attention(query, kv, None, scale)
    got = paged_decode_attention(query, kv, tables, None, positions, scale, splits[0],
                                 block_n=block_ns[0])
    rel_err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    return {"batch": batch, "context": context, "triton_us": triton_us,
            "triton_us_by_splits": by_splits, "rule": f"{rule.num_splits}x{rule.block_n}",
            "fa2_us": round(fa2_us, 2), "triton_over_fa2": round(triton_us / fa2_us, 3),
            "fa2_plan_host_us": round(statistics.median(plan_times), 1),
            "rel_err_vs_fa2": float(f"{rel_err:.2e}")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buckets", type=counts, default="1,16,64,256")
    parser.add_argument("--context", type=count, default=640)
    parser.add_argument("--splits", type=counts,
                        help="the Triton kernel's key splits to time, the first against fa2 "
                             "(default: the engine's count for each bucket, decode_tile)")
    parser.add_argument("--block-n", type=counts,
                        help="the Triton kernel's keys a tile to time, each a power of two >= "
                             "16, every split count at each (default: the engine's for each "
                             "bucket, decode_tile)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    if not require_cuda("resident.tools.bench_attention"):
        return 2
    device = torch.device("cuda")
    rows = [bench_bucket(b, args.context, device, tuple(args.splits or ()),
                         tuple(args.block_n or ())) for b in args.buckets]
    print(f"{'batch':>6} {'triton us':>10} {'fa2 us':>8} {'ratio':>6} {'fa2 plan us':>12} "
          f"{'rule':>5}  triton us by splits (x keys a tile)")
    for row in rows:
        by_splits = " ".join(f"{s}:{us}" for s, us in row["triton_us_by_splits"].items())
        print(f"{row['batch']:>6} {row['triton_us']:>10} {row['fa2_us']:>8} "
              f"{row['triton_over_fa2']:>6} {row['fa2_plan_host_us']:>12} "
              f"{row['rule']:>5}  {by_splits}")
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
