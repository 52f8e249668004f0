"""A hand-built profile window written both as torch.profiler's Chrome trace (Kineto's event
layout) and as nsys stats CSVs (the column layout nsys 2023-2024 prints), for the profile tests:
the numbers are known, and the two tools must give the same tables. Hand-written in each tool's
format, not recorded on a GPU."""

from __future__ import annotations

from resident.profiling.timeline import KIND_PREFIX, STEP_RANGE

STEP_THREAD = 7

# Three decode steps, 1000 µs apart (host ranges of 900 µs); each replays one graph of three
# kernels (gemm 100 µs, a 20 µs gap, attn 50 µs, a 10 µs gap, norm 20 µs: the span 200 µs, busy
# 170) and the last step also launches one eager Triton kernel (sample, 30 µs, 50 µs after the
# graph) and one memcpy (5 µs). One mixed step follows with one eager kernel. A kernel launched
# between steps is nobody's.
STEPS = [("decode", 0, 900), ("decode", 1000, 1900), ("decode", 2000, 2900), ("mixed", 3000, 3900)]


def _window(head: bool = False):
    """(launches: (corr, api, host ts), ops: (name, start, dur, corr, category)). The head's
    decode graph adds a 4 µs `gather` kernel and its attn takes 60 µs, not 50."""
    launches, ops = [], []
    for step, (_, start, _) in enumerate(STEPS[:3]):
        corr = 100 + step
        launches.append((corr, "cudaGraphLaunch", start + 50))
        gpu = start + 100
        ops += [("gemm", gpu, 100, corr, "kernel"), ("attn", gpu + 120, 60 if head else 50, corr,
                                                      "kernel")]
        ops.append(("norm", gpu + 180, 20, corr, "kernel"))
        if head:
            ops.append(("gather", gpu + 101, 4, corr, "kernel"))
    launches += [(200, "cuLaunchKernel", 2060), (201, "cudaMemcpyAsync", 2070)]
    ops += [("sample", 2350, 30, 200, "kernel"), ("Memcpy DtoH", 2400, 5, 201, "gpu_memcpy")]
    launches.append((300, "cuLaunchKernel", 3100))
    ops.append(("mixed_kernel", 3200, 400, 300, "kernel"))
    launches.append((400, "cuLaunchKernel", 950))  # between steps
    ops.append(("stray", 960, 10, 400, "kernel"))
    return launches, ops


def chrome_trace(head: bool = False) -> dict:
    launches, ops = _window(head)
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "x"}}]
    for kind, start, end in STEPS:
        events.append(_x("user_annotation", STEP_RANGE, start, end - start, STEP_THREAD))
        events.append(_x("user_annotation", KIND_PREFIX + kind, end - 10, 1, STEP_THREAD))
    for corr, api, ts in launches:
        category = "cuda_driver" if api.startswith("cu") and not api.startswith("cuda") \
            else "cuda_runtime"
        events.append(_x(category, api, ts, 5, STEP_THREAD, correlation=corr))
    for name, start, dur, corr, category in ops:
        events.append(_x(category, name, start, dur, 7, correlation=corr, stream=7))
    events.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                   "ts": 5000})
    return {"schemaVersion": 1, "traceEvents": events}


def _x(category: str, name: str, ts: float, dur: float, tid: int, **args) -> dict:
    return {"ph": "X", "cat": category, "name": name, "pid": 1, "tid": tid, "ts": ts,
            "dur": dur, "args": args}


NOTICE = ("NOTICE: Existing SQLite export found: report.sqlite\n\n"
          "Processing [report.sqlite] with [/opt/nsys/reports/{}.py]... \n")


def nsys_csvs(head: bool = False) -> tuple[str, str, str]:
    """(cuda_gpu_trace, cuda_api_trace, nvtx_pushpop_trace) as `nsys stats --format csv` prints
    them, times in ns, API names with nsys's version suffixes."""
    launches, ops = _window(head)
    ns = 1000
    gpu = [NOTICE.format("cuda_gpu_trace") +
           "Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),"
           "DymSMem (MB),Bytes (MB),Throughput (MB/s),SrcMemKd,DstMemKd,Device,Ctx,GreenCtx,"
           "Strm,Name"]
    gpu += [f'{start * ns},{dur * ns},{corr},1,1,1,128,1,1,32,0.000,0.000,,,,,'
            f'NVIDIA H200 (0),1,,7,"{name}"' for name, start, dur, corr, _ in ops]
    api = [NOTICE.format("cuda_api_trace") +
           "Start (ns),Duration (ns),Name,Result,CorrID,Pid,Tid,T-Pri,Thread Name"]
    api += [f"{ts * ns},{5 * ns},{name}_v10000,0,{corr},1,{STEP_THREAD},20,python3"
            for corr, name, ts in launches]
    nvtx = ["Start (ns),End (ns),Duration (ns),DurChild (ns),DurNonChild (ns),Name,PID,TID,Lvl,"
            "NumChild,RangeId,ParentId,RangeStack,NameTree"]
    for number, (kind, start, end) in enumerate(STEPS):
        step_id, kind_id = 2 * number + 1, 2 * number + 2
        nvtx.append(f"{start * ns},{end * ns},{(end - start) * ns},{ns},{(end - start - 1) * ns},"
                    f"{STEP_RANGE},1,{STEP_THREAD},0,1,{step_id},,:{step_id},{STEP_RANGE}")
        nvtx.append(f"{(end - 10) * ns},{(end - 9) * ns},{ns},0,{ns},{KIND_PREFIX}{kind},1,"
                    f"{STEP_THREAD},1,0,{kind_id},{step_id},:{step_id}:{kind_id},"
                    f"{STEP_RANGE}:{KIND_PREFIX}{kind}")
    return "\n".join(gpu) + "\n", "\n".join(api) + "\n", "\n".join(nvtx) + "\n"
