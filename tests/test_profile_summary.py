"""Profile summaries and kernel diffs (resident/profiling/): one hand-built window written both
as torch.profiler's Chrome trace (Kineto's event layout) and as nsys stats CSVs (the column
layout nsys 2023-2024 prints), so the numbers are known and the two tools must give the same
tables. These fixtures are hand-written in each tool's format, not recorded on a GPU."""

from __future__ import annotations

import pytest

from resident.profiling.nsys import NsysFormatError, from_nsys_csv
from resident.profiling.summary import ProfileSummary, diff, summarize
from resident.profiling.timeline import KIND_PREFIX, STEP_RANGE
from resident.profiling.torch_trace import from_chrome_trace

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


@pytest.fixture(scope="module")
def summary() -> ProfileSummary:
    return summarize(from_chrome_trace(chrome_trace()))


def test_the_decode_steps_numbers(summary):
    decode = summary.kind("decode")
    assert summary.activity == "cuda" and summary.tool == "torch.profiler"
    assert decode.steps == 3
    assert decode.period_us_mean == 1000 and decode.period_us_median == 1000
    # busy: 170 a step, plus sample and memcpy in the third: (3 * 170 + 35) / 3
    assert decode.busy_us == pytest.approx((3 * 170 + 35) / 3)
    # the third step's span runs to the memcpy's end: 2405 - 2100 = 305, busy 205
    assert decode.gaps_us == pytest.approx((30 + 30 + 100) / 3)
    assert decode.graph_us_median == 200
    assert decode.idle_outside_graph_us == 800  # every decode step has a next step
    assert decode.ops_per_step == pytest.approx(11 / 3)
    table = {k.name: k for k in decode.kernels}
    assert list(table)[:3] == ["gemm", "attn", "norm"]  # costliest first
    assert table["gemm"].us_per_step == 100 and table["gemm"].calls_per_step == 1
    assert table["sample"].us_per_step == 10 and table["sample"].calls_per_step == pytest.approx(
        1 / 3)
    assert table["sample"].us_sd == pytest.approx(17.3205, rel=1e-4)
    assert table["gemm"].us_sd == 0


def test_a_kind_without_graphs_and_the_window_edges(summary):
    mixed = summary.kind("mixed")
    assert mixed.steps == 1 and mixed.period_us_mean is None  # the window's last step
    assert mixed.graph_us_median is None and mixed.idle_outside_graph_us is None
    assert mixed.busy_us == 400 and mixed.gaps_us == 0
    assert summary.unattributed == 1  # `stray`, launched between steps
    assert summary.window_us == 3900
    assert ProfileSummary.from_dict(summary.to_dict()) == summary


def test_nsys_reports_give_the_same_tables(summary):
    from_nsys = summarize(from_nsys_csv(*nsys_csvs()))
    assert from_nsys.tool == "nsys"
    assert from_nsys.kinds == summary.kinds
    assert from_nsys.unattributed == summary.unattributed


def test_an_nsys_report_without_its_columns_is_named():
    gpu, api, nvtx = nsys_csvs()
    with pytest.raises(NsysFormatError, match="cuda_api_trace: missing columns \\['corrid'\\]"):
        from_nsys_csv(gpu, api.replace("CorrID", "Correlation"), nvtx)
    with pytest.raises(NsysFormatError, match="nvtx_pushpop_trace: no header"):
        from_nsys_csv(gpu, api, "nothing here\n")


def test_the_diff_names_what_the_head_adds_and_changes(summary):
    head = summarize(from_chrome_trace(chrome_trace(head=True)))
    result = diff(summary.kind("decode"), head.kind("decode"))
    assert [(c.name, c.status) for c in result.of("added")] == [("gather", "added")]
    assert [(c.name, c.delta_us) for c in result.of("changed")] == [("attn", 10)]
    assert not result.of("removed")
    assert {c.name for c in result.of("same")} == {"gemm", "norm", "sample", "Memcpy DtoH"}
    assert result.headline() == (
        "decode: the head adds 1 kernel (+4.0 µs); changes 1 kernel (+10.0 µs); kernels sum to "
        f"{head.kind('decode').kernel_us:.1f} vs {summary.kind('decode').kernel_us:.1f} µs a "
        "step, +1.0 launches, gaps -14.0 µs")  # 30 -> 1 + 15 + 0 in each graph


def test_a_difference_inside_the_noise_is_not_a_change(summary):
    """`sample` runs in one decode step of three: its µs a step varies (sd 17 µs), so a 5 µs
    shift of its mean is noise; the same shift of `gemm`, steady in every step, is not."""
    base = summary.kind("decode")
    shifted = [k if k.name not in ("sample", "gemm") else
               type(k)(k.name, k.us_per_step + 5, k.calls_per_step, k.us_sd)
               for k in base.kernels]
    result = diff(base, type(base)(**{**base.__dict__, "kernels": tuple(shifted)}))
    status = {c.name: c.status for c in result.changes}
    assert status["gemm"] == "changed" and status["sample"] == "same"
