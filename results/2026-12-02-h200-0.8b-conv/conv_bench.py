"""H200 microbench of the varlen conv at a 2,304-token padded step of the 0.8B (C=6144,
Kd=Vd=2048, Dk=128, x a column slice of the 8,224-wide projection): the kernel before (read
from git at 495afae: [BT, BC] tiles whose stores compute each channel's plane), one Dk head a
program with l2norm fused (conv_plane.py), and that with a fast path for blocks inside one row
(conv_fast.py, what 3539f0f shipped), timed as CUDA-graph replays of 20 launches (no host launch
cost), tiles swept; plus fla's l2norm_fwd, which the fused conv replaces (two a layer).
Run from the tree's root: PYTHONPATH=$PWD python3 results/2026-12-02-h200-0.8b-conv/conv_bench.py"""
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton

HERE = Path(__file__).parent
# the kernel before, from git (495afae), as a file (Triton reads a kernel's source from one)
OLD = Path(tempfile.mkdtemp()) / "conv_old.py"
OLD.write_text(subprocess.run(["git", "show", "495afae:resident/kernels/conv_varlen.py"],
                              capture_output=True, text=True, check=True, cwd=HERE).stdout)
sys.path[:0] = [str(HERE), str(OLD.parent)]
import conv_fast  # noqa: E402
import conv_old  # noqa: E402
import conv_plane as conv_new  # noqa: E402

from resident.kernels.gdn_decode import L2NORM_EPS, compute_dtype  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
T, C, KD, DK, W = 2304, 6144, 2048, 128, 4
lengths = [144] * 16
qsl = torch.tensor([0, *lengths], device=dev).cumsum(0)
seq = torch.repeat_interleave(torch.arange(16, device=dev), torch.tensor(lengths, device=dev))
slots = torch.arange(1, 17, device=dev)
wide = torch.randn(T, 8224, device=dev, dtype=torch.bfloat16)
x = wide[:, :C]
weight = torch.randn(C, W, device=dev, dtype=torch.bfloat16)
pool = torch.randn(40, C, W, device=dev, dtype=torch.bfloat16)
y = torch.empty(T * C, device=dev, dtype=torch.bfloat16)


def graph_us(fn, n=20, reps=20):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (n * reps) * 1000


def old_kernel(bt, bc, warps):
    def fn():
        conv_old._conv_varlen_kernel[(triton.cdiv(T, bt), triton.cdiv(C, bc))](
            x, weight, pool, slots, qsl, seq, y, x.stride(0), x.stride(1), weight.stride(0),
            weight.stride(1), pool.stride(0), pool.stride(1), pool.stride(2), T, C, KD,
            WIDTH=W, BLOCK_T=bt, BLOCK_C=bc, COMPUTE=compute_dtype(weight.dtype),
            num_warps=warps)
    return fn


def new_kernel(bt, warps, norm):
    def fn():
        conv_new._conv_varlen_kernel[(triton.cdiv(T, bt), triton.cdiv(C, DK))](
            x, weight, pool, slots, qsl, seq, y, x.stride(0), x.stride(1), weight.stride(0),
            weight.stride(1), pool.stride(0), pool.stride(1), pool.stride(2), T, C, KD, DK,
            L2NORM_EPS, WIDTH=W, BLOCK_T=bt, BLOCK_C=DK, COMPUTE=compute_dtype(weight.dtype),
            L2NORM_QK=norm, num_warps=warps)
    return fn


def state_kernel():
    def fn():
        conv_old._conv_state_kernel[(16, triton.cdiv(C, 64))](
            x, pool, slots, qsl, x.stride(0), x.stride(1), pool.stride(0), pool.stride(1),
            pool.stride(2), C, WIDTH=W, BLOCK_W=4, BLOCK_C=64, num_warps=2)
    return fn


from fla.modules.l2norm import l2norm_fwd  # noqa: E402

q3 = torch.randn(T, 16, DK, device=dev, dtype=torch.bfloat16)
print(f"fla l2norm_fwd [2304, 16, 128]: {graph_us(lambda: l2norm_fwd(q3)):.1f} us (x2 a layer)")
print(f"state kernel: {graph_us(state_kernel()):.1f} us")
rows = []
for bt in (4, 8, 16, 32):
    for bc in (64, 128, 256):
        for warps in (1, 2, 4, 8):
            if bt * bc < 32 * warps * 2:
                continue
            us = graph_us(old_kernel(bt, bc, warps))
            rows.append((us, "old", bt, bc, warps))
            print(f"old BT={bt} BC={bc} warps={warps}: {us:.1f} us", flush=True)
for bt in (2, 4, 8, 16, 32):
    for warps in (1, 2, 4, 8):
        for norm in (False, True):
            us = graph_us(new_kernel(bt, warps, norm))
            rows.append((us, f"new norm={norm}", bt, DK, warps))
            print(f"new BT={bt} warps={warps} norm={norm}: {us:.1f} us", flush=True)
for kind in ("old", "new norm=False", "new norm=True"):
    best = min(r for r in rows if r[1] == kind)
    print(f"BEST {kind}: {best[0]:.1f} us at BT={best[2]} BC={best[3]} warps={best[4]}")


def fast_kernel(bt, warps, norm, out):
    def fn():
        conv_fast._conv_fast_kernel[(triton.cdiv(T, bt), triton.cdiv(C, DK))](
            x, weight, pool, slots, qsl, seq, out, x.stride(0), x.stride(1), weight.stride(0),
            weight.stride(1), pool.stride(0), pool.stride(1), pool.stride(2), T, C, KD, DK,
            L2NORM_EPS, WIDTH=W, BLOCK_T=bt, BLOCK_C=DK, COMPUTE=compute_dtype(weight.dtype),
            L2NORM_QK=norm, num_warps=warps)
    return fn


want = torch.empty_like(y)
new_kernel(8, 2, True)()
want.copy_(y)
for bt in (4, 8, 16, 32):
    for warps in (1, 2, 4, 8):
        got = torch.zeros_like(y)
        fast_kernel(bt, warps, True, got)()
        err = (got.float() - want.float()).abs().max().item()
        us = graph_us(fast_kernel(bt, warps, True, y))
        rows.append((us, "fast norm=True", bt, DK, warps))
        print(f"fast BT={bt} warps={warps} norm=True: {us:.1f} us (max diff {err:.3g})",
              flush=True)
best = min(r for r in rows if r[1] == "fast norm=True")
print(f"BEST fast: {best[0]:.1f} us at BT={best[2]} warps={best[4]}")
