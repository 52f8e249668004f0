"""`resident-gate run --profile`: profile.md from recorded windows, and a real session on the
tiny CPU model whose servers each open one window per cell after the cell's timed runs."""

from __future__ import annotations

import gzip
import json

from test_gate_run import SHORT, invoke, servers_left

from gate.manifest import Manifest
from gate.records import read_profiles, read_runs
from gate.report.profile import render_profile_md
from resident.profiling.summary import summarize
from resident.profiling.torch_trace import from_chrome_trace

from profile_fixtures import chrome_trace

MANIFEST = {"name": "t", "baseline": "main", "arms": [{"name": n} for n in ("main", "head", "old")],
            "profile": {"tool": "torch.profiler", "why": "a test"}}


def _record(arm: str, head: bool = False, error: str | None = None) -> dict:
    summary = None if error else summarize(from_chrome_trace(chrome_trace(head))).to_dict()
    return {"round": 0, "arm": arm, "concurrency": 4, "steps": 4, "trace": None,
            "summary": summary, "error": error}


def test_profile_md_lays_out_each_arm_and_the_diff_against_the_baseline():
    records = [_record("main"), _record("head", head=True),
               _record("old", error="POST /debug/profile answered 404: no /debug/profile")]
    text = render_profile_md(Manifest.from_dict(MANIFEST), records)
    assert "## c=4" in text and "Tool: torch.profiler (a test)" in text
    assert "- old: POST /debug/profile answered 404" in text
    steps = [line for line in text.splitlines() if line.startswith("| main | decode")]
    assert len(steps) == 1 and "| 3 |" in steps[0]  # the fixture's three decode steps
    kernels = text.split("### decode kernels")[1].split("###")[0]
    assert "| gather | - | 4.0 / 4.0 (1) |" in kernels
    assert "| attn | 50.0 / 50.0 (1) | 60.0 / 60.0 (1) |" in kernels
    diff = text.split("**head against the baseline.**")[1]
    assert "| added | gather |" in diff and "| changed | attn |" in diff
    assert "**old against" not in text and "**main against" not in text


def test_a_profiled_session_profiles_every_cell_after_its_timed_runs(tmp_path):
    out = tmp_path / "session"
    result = invoke("run", "--arm", "main=.", "--arm", "head=.",
                    "--set", "main.resident_planning=off", "--concurrency", "1,2",
                    "--rounds", "1", "--runs", "1", "--profile", "--profile-steps", "4",
                    "--out", str(out), *SHORT)
    assert result.exit_code == 0, result.output
    manifest = Manifest.read(out).to_dict()
    assert manifest["profile"]["tool"] == "torch.profiler" and manifest["profile"]["steps"] == 4
    records = read_profiles(out)
    assert sorted((r["arm"], r["concurrency"]) for r in records) == [
        (a, c) for a in ("head", "main") for c in (1, 2)]
    runs = read_runs(out)
    for record in records:
        assert record["error"] is None, record
        cell_runs = [r for r in runs if (r.arm, r.concurrency) == (record["arm"],
                                                                   record["concurrency"])]
        assert cell_runs and all(r.ok for r in cell_runs)
        assert record["started_at"] > max(r.started_at for r in cell_runs)
        kinds = record["summary"]["kinds"]
        assert sum(k["steps"] for k in kinds) == 4
        assert all(k["kernels"] for k in kinds if k["steps"])
        with gzip.open(out / record["trace"], "rt") as file:
            assert json.load(file)["traceEvents"]
    text = (out / "profile.md").read_text()
    assert "## c=1" in text and "## c=2" in text and "head against the baseline" in text
    assert not servers_left(result)


def test_profile_steps_below_one_is_named(tmp_path):
    result = invoke("run", "--arm", "main=.", "--profile", "--profile-steps", "0",
                    "--out", str(tmp_path / "s"), *SHORT)
    assert result.exit_code != 0 and "--profile-steps must be >= 1, got 0" in result.output
