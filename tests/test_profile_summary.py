"""Profile summaries and kernel diffs (resident/profiling/) on the hand-built window of
profile_fixtures.py: its numbers are known, and torch.profiler's trace and nsys's CSVs of it
must give the same tables; and on six decode steps recorded on the H200 (tests/golden/h200-profile,
cut by tests/gpu/trim_trace.py from `resident-gate run --profile`'s traces, results/
2026-12-01-h200-0.8b-profile)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from resident.profiling.nsys import NsysFormatError, from_nsys_csv
from resident.profiling.summary import (
    ProfileSummary,
    diff,
    frontier_shares,
    summarize,
    union_us,
)
from resident.profiling.torch_trace import from_chrome_trace

from profile_fixtures import chrome_trace, nsys_csvs


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
    # no kernel overlaps another here: each is exposed for all of its µs
    assert all(k.exposed_us_per_step == pytest.approx(k.us_per_step) for k in decode.kernels)


def test_overlapping_kernels_share_the_busy_time_by_what_each_adds():
    # under PDL: the second kernel launches at 5 and waits inside the first until 10, then
    # runs to 12; the fourth starts and ends inside the third; the last starts after a gap
    intervals = [(0.0, 10.0), (5.0, 12.0), (12.0, 20.0), (13.0, 15.0), (25.0, 26.0)]
    shares = frontier_shares(intervals)
    assert shares == [10.0, 2.0, 8.0, 0.0, 1.0]
    assert sum(shares) == union_us(intervals) == 21.0
    # the order given is kept: each share stays with its interval
    assert frontier_shares(intervals[::-1]) == shares[::-1]
    assert frontier_shares([]) == []


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


def test_run_to_run_drift_and_the_window_mix_are_not_changes(summary):
    """Two servers run a steady kernel ~1% apart, and a window whose steps mix kinds gives
    fractional calls a step: neither is a change; a kernel launched once more a step is."""
    base = summary.kind("decode")
    us = {k.name: k.us_per_step for k in base.kernels}
    drifted = {"gemm": (us["gemm"] * 1.01, 1.0), "attn": (us["attn"], 0.97),
               "norm": (us["norm"], 2.0)}
    kernels = tuple(type(k)(k.name, *drifted.get(k.name, (k.us_per_step, k.calls_per_step)),
                            k.us_sd) for k in base.kernels)
    result = diff(base, type(base)(**{**base.__dict__, "kernels": kernels}))
    status = {c.name: c.status for c in result.changes}
    assert (status["gemm"], status["attn"], status["norm"]) == ("same", "same", "changed")


def _recorded(arm: str) -> ProfileSummary:
    path = Path(__file__).parent / "golden" / "h200-profile" / f"{arm}-c1.json.gz"
    with gzip.open(path, "rt") as file:
        return summarize(from_chrome_trace(json.load(file)))


def test_recorded_h200_steps_read_as_graph_replays():
    """qwen3.5-0.8b at c=1, planning off, fa2 decode: each step replays one graph of ~295
    kernels that keeps the GPU ~80% busy; every kernel is attributed to its step."""
    decode = _recorded("off-flashinfer").kind("decode")
    assert decode.steps == 6 and 280 <= decode.ops_per_step <= 310
    assert 1000 < decode.graph_us_median < decode.period_us_mean < 1500
    assert 0.7 < decode.busy_share < 0.95
    assert decode.kernel_us == pytest.approx(sum(k.us_per_step for k in decode.kernels))
    # the kernels' exposed µs add up to the step's busy time
    assert sum(k.exposed_us_per_step for k in decode.kernels) == pytest.approx(decode.busy_us)


def test_recorded_h200_diff_explains_the_triton_decode_gap():
    """The triton arm's decode step is ~8% shorter than fa2's: its split-K attention
    (_split_kernel + _combine_kernel, ~58 µs a step) replaces fa2's decode and merge kernels
    (~119 µs), and fa2's per-step pageable plan upload is gone."""
    result = diff(_recorded("off-flashinfer").kind("decode"),
                  _recorded("off-triton").kind("decode"))
    assert {c.name for c in result.of("added")} == {"_split_kernel", "_combine_kernel"}
    removed = {c.name.split("<")[0] for c in result.of("removed")}
    assert removed == {"void flashinfer::BatchDecodeWithPagedKVCacheKernel",
                       "void flashinfer::PersistentVariableLengthMergeStatesKernel",
                       "Memcpy HtoD (Pageable -> Device)"}
    assert not result.of("changed")  # the GEMMs, GDN and norms are the same kernels
    assert -75 < result.head.kernel_us - result.base.kernel_us < -45
    assert result.head.period_us_mean < 0.95 * result.base.period_us_mean
