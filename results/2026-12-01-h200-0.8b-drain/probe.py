"""GPU probe: conv_varlen variants, fla padding-sequence and gather/scatter cost, eager burst
op attribution. The script as it ran (README), formatted; not part of the tree.

    python3 probe.py --engine   # from the tree's root, PYTHONPATH=$PWD:/tmp/site
"""
# ruff: noqa: B023, E402 - each lambda runs inside its loop turn; fla is imported where used

import sys
import time

import numpy as np
import torch
import triton
from triton.testing import do_bench

from resident.engine.varlen import chunk_table
from resident.kernels import conv_varlen as cv
from resident.kernels.gdn_decode import compute_dtype

dev = "cuda"
T, C, W, KD, VD = 2304, 6144, 4, 2048, 2048
torch.manual_seed(0)
proj = torch.randn(T, 8224, device=dev, dtype=torch.bfloat16)
x = proj[:, :C]
weight = torch.randn(C, W, device=dev, dtype=torch.bfloat16)
pool = torch.randn(257, C, W, device=dev, dtype=torch.bfloat16)
rows = 16
qsl = torch.tensor([0, 512, 1024, 1536] + [2048] * (rows - 2), device=dev)
slots = torch.arange(1, rows + 1, device=dev)
seq = torch.clamp(torch.arange(T, device=dev) // 512, max=4)


def conv(bt, bc, nw, xx=x):
    y = torch.empty(T * C, dtype=xx.dtype, device=dev)
    cv._conv_varlen_kernel[(triton.cdiv(T, bt), triton.cdiv(C, bc))](
        xx,
        weight,
        pool,
        slots,
        qsl,
        seq,
        y,
        xx.stride(0),
        xx.stride(1),
        weight.stride(0),
        weight.stride(1),
        pool.stride(0),
        pool.stride(1),
        pool.stride(2),
        T,
        C,
        KD,
        WIDTH=W,
        BLOCK_T=bt,
        BLOCK_C=bc,
        COMPUTE=compute_dtype(weight.dtype),
        num_warps=nw,
    )
    return y


print(
    "copy x->y (floor):",
    round(do_bench(lambda: torch.empty(T, C, dtype=x.dtype, device=dev).copy_(x)) * 1e3, 1),
    "us",
)
print(
    "current (16,128,4):",
    round(
        do_bench(lambda: cv.causal_conv_varlen(x, weight, pool, slots, qsl, seq, (KD, KD, VD)))
        * 1e3,
        1,
    ),
    "us (with state kernel)",
)
for bt in (8, 16, 32, 64):
    for bc in (64, 128, 256):
        for nw in (2, 4, 8):
            try:
                t = do_bench(lambda: conv(bt, bc, nw)) * 1e3
                print(f"conv bt={bt} bc={bc} nw={nw}: {t:.1f} us", flush=True)
            except Exception as e:
                print(f"conv bt={bt} bc={bc} nw={nw}: {type(e).__name__}")
xc = x.contiguous()
print("contig x (16,128,4):", round(do_bench(lambda: conv(16, 128, 4, xc)) * 1e3, 1))

# fla: padding sequences, strided inputs, gather/scatter
import fla.utils
from fla.ops.gated_delta_rule import chunk_gated_delta_rule

fla.utils.FLA_DISABLE_TENSOR_CACHE = True
H, D = 16, 128
mixed = torch.randn(T, C, device=dev, dtype=torch.bfloat16)
q, k, v = (t.view(T, H, D) for t in mixed.split([KD, KD, VD], dim=-1))
g = -torch.rand(T, H, device=dev, dtype=torch.float32)
beta = torch.rand(T, H, device=dev, dtype=torch.bfloat16)
state = torch.zeros(257, H, D, D, device=dev, dtype=torch.float32)


def table(cu):
    cu_np = np.array(cu, np.int64)
    out = np.zeros((T // 64 + len(cu) + 2, 2), np.int64)
    chunk_table(cu_np, out, 64)
    return torch.tensor(cu_np, device=dev), torch.tensor(out, device=dev)


def fla_run(cu, chunks, sl, qq, kk, vv, gather=True):
    init = state[sl] if gather else state[: len(sl)]
    o, fin = chunk_gated_delta_rule(
        qq.unsqueeze(0),
        kk.unsqueeze(0),
        vv.unsqueeze(0),
        g.unsqueeze(0),
        beta.unsqueeze(0),
        scale=D**-0.5,
        initial_state=init,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu,
        chunk_indices=chunks,
    )
    if gather:
        state[sl] = fin
    return o


cu17 = [0, 0, 512, 1024, 1536, 2048] + [2048] * 12
cu5 = [0, 0, 512, 1024, 1536, 2048]
for name, cu in (("17 seqs", cu17), ("5 seqs", cu5)):
    cut, ch = table(cu)
    sl = torch.arange(1, len(cu), device=dev)
    for label, qq, kk, vv in (
        ("strided", q, k, v),
        ("contig", q.contiguous(), k.contiguous(), v.contiguous()),
    ):
        t1 = do_bench(lambda: fla_run(cut, ch, sl, qq, kk, vv)) * 1e3
        t2 = do_bench(lambda: fla_run(cut, ch, sl, qq, kk, vv, gather=False)) * 1e3
        print(f"fla {name} {label}: {t1:.1f} us with gather/scatter, {t2:.1f} without", flush=True)
sl17 = torch.arange(1, 18, device=dev)
fin = torch.randn(17, H, D, D, device=dev)
print(
    "gather 17:",
    round(do_bench(lambda: state[sl17]) * 1e3, 1),
    "scatter 17:",
    round(do_bench(lambda: state.__setitem__(sl17, fin)) * 1e3, 1),
    "index_copy_ 17:",
    round(do_bench(lambda: state.index_copy_(0, sl17, fin)) * 1e3, 1),
)
print("contiguous q:", round(do_bench(lambda: q.contiguous()) * 1e3, 1))
sys.stdout.flush()

if "--engine" in sys.argv:
    from torch.profiler import ProfilerActivity, profile

    from resident.config import build_engine_config, model_yaml_knobs, parse_set_options
    from resident.engine.engine import build_engine
    from resident.model.config import load_model_config
    from resident.tools.bench import _burst_once

    model = load_model_config("qwen3.5-0.8b")
    config = build_engine_config(
        model_yaml_knobs("qwen3.5-0.8b"), None, parse_set_options(["cuda_graphs=off"])
    )
    t0 = time.time()
    engine = build_engine(model, config, "cuda")
    print("engine built", round(time.time() - t0, 1), "s", flush=True)
    print(_burst_once(engine, "w1", 64, 512))
    print(_burst_once(engine, "w2", 64, 512))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        r = _burst_once(engine, "p", 64, 512)
        torch.cuda.synchronize()
    print(r)
    print(
        prof.key_averages().table(
            sort_by="self_cuda_time_total", row_limit=60, max_name_column_width=70
        )
    )
