"""The gate's reports: golden markdown for a synthetic session, plots, and `report` via typer.

Regenerate the golden files after an intended change with
`UPDATE_GOLDEN=1 python -m pytest tests/test_gate_tables.py`, then read the diff.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gate.commands.report import report
from gate.manifest import Manifest, write_manifest_json
from gate.metrics import ServeMetrics
from gate.records import GpuSample, RunRecord, append_run, read_runs
from gate.report import markdown, notes, rounds, summary, write
from gate.report.timing import startup_wall, time_line, time_summary
from gate.run.load import LoadSpec, RequestResult, summarize
from gate.run.server import gc_pause_s

GOLDEN = Path(__file__).parent / "golden" / "gate"
REPORTS = (rounds.ROUNDS_FILE, summary.SUMMARY_FILE, summary.SUMMARY_JSON, write.PAIRED_FILE)
INPUTS = ("runs.jsonl", "manifest.json")
PLOTS = ("tok_s.png", "itl.png")

MANIFEST = {
    "name": "golden", "baseline": "main", "aa_arm": None, "cells": [1, 16], "rounds": 2,
    "runs": 2, "model": "tiny", "device": "cpu", "prompt_len": 64, "output_len": 16,
    "arms": [
        {"name": "main", "spec": "git:HEAD~1", "kind": "resident", "knobs": {},
         "planner_off": False},
        {"name": "head", "spec": ".", "kind": "resident",
         "knobs": {"resident_planning": "auto"}, "planner_off": False},
    ],
    "host": {"opaque": True},
    "timing": {"wall_s": 125.0, "servers": [
        {"round": r, "arm": a, "health_s": 3.0 + r + (a == "head"), "stop_s": 0.5}
        for r in (0, 1) for a in ("main", "head")]},
}
# (round, arm, concurrency) -> tok/s of runs 1 and 2; None marks a failed run
TOK_S = {
    (0, "main", 1): (100.0, 104.0), (0, "head", 1): (110.0, 112.5),
    (1, "main", 1): (98.0, 101.0), (1, "head", 1): (109.0, 111.0),
    (0, "main", 16): (1500.0, 1480.0), (0, "head", 16): (1650.0, None),
    (1, "main", 16): (1510.0, 1530.0), (1, "head", 16): (1600.0, 1620.0),
}
LOG_TAIL = ("INFO engine core up\nTraceback (most recent call last):\n"
            "  File \"core.py\", line 1, in step\nRuntimeError: CUDA error: out of memory\n")


OUTPUT_LEN = 16


def _metrics(concurrency: int, tok_s: float, failed: int) -> ServeMetrics:
    """A run's metrics through the load's own summary: 4 requests a slot, `failed` of them
    failed, TTFT and ITL spread over each request, the wall time that gives `tok_s`."""
    itl_s = concurrency / tok_s
    requests = []
    for index in range(4 * concurrency - failed):
        ttft = (5.0 + concurrency * 0.5 + index % 5) / 1e3
        gaps = [itl_s * (0.8 + 0.05 * ((index + k) % 9)) for k in range(OUTPUT_LEN - 1)]
        requests.append(RequestResult(True, OUTPUT_LEN, ttft, gaps, ttft + sum(gaps)))
    requests += [RequestResult(False, error="HTTP 500")] * failed
    spec = LoadSpec(concurrency=concurrency, num_requests=4 * concurrency, prompt_len=64,
                    output_len=OUTPUT_LEN)
    return summarize(spec, requests, OUTPUT_LEN * (4 * concurrency - failed) / tok_s).metrics


def _record(round_index: int, arm: str, concurrency: int, run: int,
            tok_s: float | None) -> RunRecord:
    position = (0 if arm == "main" else 1) if round_index % 2 == 0 else (
        1 if arm == "main" else 0)
    common = {"round": round_index, "arm": arm, "position": position, "concurrency": concurrency,
              "run": run, "started_at": 1_700_000_000.0 + 60 * (round_index * 8 + run)}
    if tok_s is None:
        return RunRecord(**common, ok=False, error="server exited with code 1",
                         log_tail=LOG_TAIL, server_tracebacks=1)
    itl = 1000.0 * concurrency / tok_s
    failed = 2 if (round_index, arm, concurrency, run) == (1, "main", 1, 1) else 0
    return RunRecord(
        **common, ok=True, metrics=_metrics(concurrency, tok_s, failed),
        steps={"decode": 60, "prefill": 4} | ({"mixed": 3} if concurrency > 1 else {}),
        # a server that reports no step times (another engine) in main's second round; at
        # c=1 no step mixes prefill and decode
        step_ms={} if round_index == 1 and arm == "main" else
        {"decode": round(itl * 0.9, 3), "prefill": round(4.0 + concurrency * 0.25, 3)}
        | ({"mixed": round(6.0 + concurrency * 0.5, 3)} if concurrency > 1 else {}),
        sibling_busy_cpus=None if round_index == 1 and arm == "main" else 0.5 + run * 0.25,
        # head's prefix cache hits every request at c=16 (a 512-token prefix), main's is off;
        # c=1 runs come from a server without the counters
        prefix={} if concurrency == 1 else {"hits": 0, "saved_tokens": 0} if arm == "main"
        else {"hits": 4 * concurrency - failed, "saved_tokens": 512 * (4 * concurrency - failed)},
        # the engine core's TTFT parts at c=16 only (c=1 from a server without them): the core
        # takes 5 of the client's ~11-15 ms, head's queue the shorter (its prefix hits)
        core_ms={} if concurrency == 1 else
        {"queue": 1.0 if arm == "head" else 2.0, "prefill": 3.0 + run * 0.5,
         "ttft": (1.0 if arm == "head" else 2.0) + 3.0 + run * 0.5},
        # the API process at 0.4 of a core at c=1, 0.7 at c=16, and at its limit (0.95) in
        # head at c=16; the engine core at 1.5 cores; one client at 0.3 of a core at c=1, two
        # at c=16, at their limit (1.9 cores) in head; main's second round reads no /proc
        **({} if round_index == 1 and arm == "main" else _server_cpu(
            OUTPUT_LEN * (4 * concurrency - failed) / tok_s,
            0.4 if concurrency == 1 else 0.95 if arm == "head" else 0.7,
            1 if concurrency == 1 else 2,
            0.3 if concurrency == 1 else 1.9 if arm == "head" else 0.6)),
        gpu=GpuSample(sm_clock_mhz=1980.0, power_w=250.0) if concurrency == 16 else None,
        planner_off=arm == "head" and round_index == 1)


def _server_cpu(duration_s: float, api_share: float, num_clients: int,
                client_share: float) -> dict[str, float]:
    return {"api_cpu_s": round(api_share * duration_s, 3),
            "core_cpu_s": round(1.5 * duration_s, 3),
            "client_cpu_s": round(client_share * duration_s, 3), "num_clients": num_clients}


def build_session(directory: Path) -> None:
    """The synthetic session: main/head, c=1 and c=16, 2 rounds x 2 runs, one failed run."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "runs.jsonl").unlink(missing_ok=True)
    write_manifest_json(directory, MANIFEST)
    for (round_index, arm, concurrency), values in sorted(TOK_S.items()):
        for run, tok_s in enumerate(values, start=1):
            append_run(directory, _record(round_index, arm, concurrency, run, tok_s))


def _regenerate() -> None:
    build_session(GOLDEN)
    write.write_reports(GOLDEN)
    for name in PLOTS:
        (GOLDEN / name).unlink()


def test_golden_reports(tmp_path):
    if os.environ.get("UPDATE_GOLDEN") == "1":
        _regenerate()
    built = tmp_path / "built"
    build_session(built)
    for name in INPUTS:
        assert (built / name).read_text() == (GOLDEN / name).read_text(), name
    session = tmp_path / "session"
    session.mkdir()
    for name in INPUTS:
        shutil.copy(GOLDEN / name, session / name)
    rows = write.write_reports(session)
    for name in REPORTS:
        assert (session / name).read_text() == (GOLDEN / name).read_text(), name
    for name in PLOTS:
        assert (session / name).stat().st_size > 0, name
    assert [(r["cell"], r["arm"]) for r in rows] == [
        ("c=1", "main"), ("c=1", "head"), ("c=16", "main"), ("c=16", "head")]


def test_summary_rows_values(tmp_path):
    build_session(tmp_path)
    rows = {(r["cell"], r["arm"]): r for r in write.write_reports(tmp_path)}
    head16 = rows[("c=16", "head")]
    assert head16["runs_ok"] == 3 and head16["runs_failed"] == 1
    assert head16["output_throughput"] == 1620.0
    assert (head16["output_throughput_min"], head16["output_throughput_max"]) == (1600.0, 1650.0)
    assert head16["request_throughput"] == 1620.0 / OUTPUT_LEN
    assert head16["vs_baseline"] == round(1620.0 / 1505.0 - 1, 4)
    assert head16["verdict"] == "too few rounds"
    assert head16["tracebacks"] == 1 and head16["planner_off"] is True
    # latencies are ordered as their names say
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert (head16[f"median_{name}_ms"] <= head16[f"p90_{name}_ms"]
                <= head16[f"p99_{name}_ms"]), name
    main1 = rows[("c=1", "main")]
    assert main1["vs_baseline"] is None and main1["verdict"] is None
    assert main1["failed"] == 2 and main1["completed"] == 4 * 4 * 1 - 2
    assert main1["total_output_tokens"] == main1["completed"] * OUTPUT_LEN
    json.dumps(list(rows.values()))  # plain Python values only


def test_server_cpu_under_procs_ticks_reads_as_not_measured(tmp_path):
    """/proc counts CPU in 10 ms ticks: runs whose API process read 0 or 1 tick give no API
    figures (not 0.0 µs a token, nor one tick over the run's tokens); the engine core's, read
    in whole seconds, stay."""
    build_session(tmp_path)
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    for run in runs:
        if run.get("api_cpu_s") is not None and run["concurrency"] == 1:
            run["api_cpu_s"] = 0.01 if run["run"] % 2 else 0.0
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(run) + "\n" for run in runs))
    rows = {(r["cell"], r["arm"]): r for r in write.write_reports(tmp_path)}
    assert rows[("c=1", "head")]["api_cpu_us_per_token"] is None
    assert rows[("c=1", "head")]["api_cpu_share"] is None
    assert rows[("c=1", "head")]["core_cpu_share"] > 1
    assert rows[("c=16", "head")]["api_cpu_share"] > 0.9
    assert "| c=1 | head (planner off!) | - | - | 1.50 |" in (tmp_path / "summary.md").read_text()


def _session(directory: Path, records: list[RunRecord], **manifest) -> Path:
    directory.mkdir()
    write_manifest_json(directory, {**MANIFEST, **manifest})
    (directory / "runs.jsonl").write_text("")
    for record in records:
        append_run(directory, record)
    return directory


def test_degenerate_sessions_do_not_crash(tmp_path):
    failed = [_record(r, a, c, 1, None) for r in (0, 1) for a in ("main", "head") for c in (1, 16)]
    head_only = [_record(r, "head", c, n, 100.0) for r in (0, 1) for c in (1, 16) for n in (1, 2)]
    one_arm = [_record(r, "main", 1, 1, 100.0) for r in (0, 1)]
    cases = {"all_failed": (failed, {}), "no_baseline": (head_only, {}),
             "one_arm": (one_arm, {"arms": MANIFEST["arms"][:1], "cells": [1]}),
             "empty": ([], {})}
    for name, (records, manifest) in cases.items():
        directory = _session(tmp_path / name, records, **manifest)
        rows = write.write_reports(directory)
        for report_name in (*REPORTS, *PLOTS):
            assert (directory / report_name).stat().st_size > 0, (name, report_name)
        verdicts = {r["verdict"] for r in rows if r["arm"] != "main"}
        assert verdicts <= {"too few rounds"}, name
    assert "too few rounds" in (tmp_path / "no_baseline" / write.PAIRED_FILE).read_text()


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(report)
    return app


def test_report_json(tmp_path):
    build_session(tmp_path)
    result = CliRunner().invoke(_app(), [str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == json.loads((tmp_path / summary.SUMMARY_JSON).read_text())
    assert [row["arm"] for row in data["cells"]] == ["main", "head", "main", "head"]
    assert (tmp_path / summary.SUMMARY_FILE).is_file()


def test_report_table_and_md(tmp_path):
    build_session(tmp_path)
    table = CliRunner().invoke(_app(), [str(tmp_path)])
    assert table.exit_code == 0, table.output
    assert "1505 [1480-1530]" in table.stdout  # numbers never wrap
    assert "too few rounds" in table.stdout  # piped: the table keeps its own width
    md = CliRunner().invoke(_app(), [str(tmp_path), "--format", "md"])
    assert md.stdout == (tmp_path / summary.SUMMARY_FILE).read_text()


def test_report_missing_paths_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = CliRunner().invoke(_app(), ["no-such-session"])
    assert missing.exit_code == 2
    assert "no-such-session" in missing.output
    Path("half-session").mkdir()
    write_manifest_json(Path("half-session"), MANIFEST)
    half = CliRunner().invoke(_app(), ["half-session"])
    assert half.exit_code == 2
    assert "half-session" in half.output and "runs.jsonl" in half.output



LEGACY = Path(__file__).parent / "golden" / "gate-legacy"


def _identity(record: RunRecord) -> tuple:
    return (record.round, record.arm, record.concurrency, record.run, record.ok,
            record.metrics.output_throughput if record.ok else None)


def test_a_session_written_by_an_older_gate_still_reports(tmp_path):
    """The golden session as the gate wrote it before rounds had their name and before
    ServeMetrics: records hold the round as `session` and their numbers flat, the manifest
    `sessions`. They read as the same runs, their numbers land in ServeMetrics' fields, and
    the verdicts come out as today's golden ones."""
    lines = [json.loads(line) for line in (LEGACY / "runs.jsonl").read_text().splitlines()]
    assert "session" in lines[0] and "output_tok_s" in lines[0] and "metrics" not in lines[0]
    assert '"sessions": 2' in (LEGACY / "manifest.json").read_text()
    old, new = read_runs(LEGACY), read_runs(GOLDEN)
    assert [_identity(r) for r in old] == [_identity(r) for r in new]
    for line, record in zip(lines, old, strict=True):
        if not line["ok"]:
            assert record.metrics is None
            continue
        metrics = record.metrics
        assert (metrics.median_itl_ms, metrics.mean_itl_ms, metrics.median_ttft_ms) == (
            line["itl_p50_ms"], line["itl_mean_ms"], line["ttft_p50_ms"])
        assert (metrics.completed, metrics.failed, metrics.duration) == (
            line["num_requests"] - line["num_failed"], line["num_failed"], line["wall_s"])
        assert metrics.p99_itl_ms is None  # not kept then
    assert Manifest.read(LEGACY).rounds == 2
    directory = tmp_path / "old"
    shutil.copytree(LEGACY, directory)
    rows = write.write_reports(directory)
    assert (directory / write.PAIRED_FILE).read_text() == (
        GOLDEN / write.PAIRED_FILE).read_text()
    golden_rows = write.write_reports(_copy_golden(tmp_path / "new"))
    assert [(r["cell"], r["arm"], r["output_throughput"], r["verdict"]) for r in rows] == [
        (r["cell"], r["arm"], r["output_throughput"], r["verdict"]) for r in golden_rows]
    text = (directory / summary.SUMMARY_FILE).read_text()
    assert "| c=1 | main | 5.50/-/- | - | 10.45/9.95/-/- | - |" in text  # not kept then
    assert "Time: not recorded" in text


def _copy_golden(directory: Path) -> Path:
    directory.mkdir()
    for name in INPUTS:
        shutil.copy(GOLDEN / name, directory / name)
    return directory


def test_short_runs_are_named():
    """A cell whose requests wait for their first token more than a tenth of a run's wall time
    is named, with the way out; a long one and one without numbers are not."""
    rows = [{"cell": "c=64", "duration": 0.87, "median_ttft_ms": 140.0},
            {"cell": "c=64", "duration": 0.91, "median_ttft_ms": 130.0},
            {"cell": "c=1", "duration": 2.3, "median_ttft_ms": 8.5},
            {"cell": "c=4", "duration": None, "median_ttft_ms": None}]
    lines = notes.short_run_lines(rows)
    assert lines == [
        "- c=64: a run lasts 0.89 s and a request waits 135 ms for its first token (median): "
        "much of each run is the start burst and the drain, and its tok/s moves with them; "
        "more requests a run (--requests-per-slot) measure the steady state."]


def test_the_summary_says_whether_an_event_loop_paced_a_cell():
    """A process busy 0.9 of a core is named with its cell; where none was, one line says so
    with the busiest of each (a client's share is its processes' over their number)."""
    def row(cell, api, client, num_clients):
        return {"cell": cell, "arm": "head", "api_cpu_share": api, "client_cpu_share": client,
                "num_clients": num_clients}

    calm = [row("c=64", 0.55, 1.2, 4), row("c=256", 0.68, 2.4, 4), row("c=1", None, None, 1)]
    assert notes.cpu_bound_lines(calm) == [
        "- No API process or load client was busy 0.9 of a core in any cell (the busiest: "
        "the API process 0.68, each client 0.60): neither set a cell's pace."]
    assert notes.cpu_bound_lines([*calm, row("c=256", 0.93, 1.0, 1)]) == [
        "- c=256 head: the API process was busy 0.93 of a core over the runs: its one event "
        "loop, not the engine, may set this cell's pace.",
        "- c=256 head: each client was busy 1.00 of a core over the runs: its one event loop, "
        "not the engine, may set this cell's pace."]
    assert notes.cpu_bound_lines([row("c=1", None, None, 1)]) == []


def test_an_open_loop_says_its_rates_and_the_requests_that_waited_for_a_slot():
    manifest = Manifest.from_dict({"cells": [16, 64], "prompt_len": 8, "output_len": 4,
                                   "request_rate": {"c=16": 20.0, "c=64": 80.5}})
    assert ("cells c=16, c=64 (open loop, Poisson arrivals: c=16 at 20 requests/s, c=64 at "
            "80.5 requests/s);") in markdown.header_line(manifest)
    assert "open loop" not in markdown.header_line(Manifest.from_dict({"cells": [16]}))
    rows = [{"cell": "c=16", "arm": "main", "requests_waited": 0, "completed": 64, "failed": 0,
             "max_concurrency": 16},
            {"cell": "c=64", "arm": "head", "requests_waited": 7, "completed": 255, "failed": 1,
             "max_concurrency": 64}]
    assert notes.waited_lines(rows) == [
        "- c=64 head: 7 of 256 requests arrived with all 64 slots busy and waited for one (not "
        "counted in their TTFT, as vLLM counts it): the rate asked more than the cell's "
        "concurrency let through."]


def test_the_summary_says_what_late_launch_took():
    rows = [{"cell": "c=16", "arm": "early", "window_arrivals": 0, "completed": 384, "failed": 0},
            {"cell": "c=16", "arm": "late", "window_arrivals": 118, "completed": 383,
             "failed": 1},
            {"cell": "c=64", "arm": "late", "window_arrivals": None, "completed": 9,
             "failed": None}]
    assert notes.window_lines(rows) == [
        "- c=16: late launch took requests into the step after the one running when they came: "
        "late 118 of 384 requests."]



def test_the_summary_names_the_engine_cores_garbage_collection_from_half_a_percent():
    rows = [{"cell": "c=64", "arm": "main", "core_gc_share": 0.001},
            {"cell": "c=64", "arm": "head", "core_gc_share": 0.0049},
            {"cell": "c=256", "arm": "main", "core_gc_share": 0.012},
            {"cell": "c=256", "arm": "head", "core_gc_share": None}]
    assert notes.gc_lines(rows) == [
        "- c=256: the engine core's garbage collector paused it for this share of a run's wall "
        "(median): main 1.2%."]


def test_a_runs_gc_pauses_sum_the_generations_and_are_none_without_the_counters():
    before = {'resident_gc_pause_seconds_total{kind="0"}': 0.5,
              'resident_gc_pause_seconds_total{kind="2"}': 1.0}
    after = {'resident_gc_pause_seconds_total{kind="0"}': 0.75,
             'resident_gc_pause_seconds_total{kind="1"}': 0.125,
             'resident_gc_pause_seconds_total{kind="2"}': 1.5}
    assert gc_pause_s(before, after) == pytest.approx(0.875)
    assert gc_pause_s({}, {"resident_steps_total": 3.0}) is None

def test_start_up_counts_servers_that_started_together_once():
    """The summary's start-up is the wall time with a server starting: overlapping spans count
    once (--parallel-start), spans one after another add up, and a server from a manifest
    without `launched_at` adds its whole start."""
    servers = [{"launched_at": 100.0, "health_s": 2.0}, {"launched_at": 100.5, "health_s": 2.5},
               {"launched_at": 110.0, "health_s": 1.0}, {"launched_at": 111.0, "health_s": None},
               {"health_s": 4.0}]
    manifest = Manifest.from_dict({"parallel_start": True, "timing": {
        "wall_s": 20.0, "servers": [{"round": 0, "arm": "main", **s} for s in servers]}})
    assert startup_wall(manifest.timing.servers) == pytest.approx(3.0 + 1.0 + 4.0)
    assert time_summary(manifest)["startup_s"] == pytest.approx(8.0)
    assert "started together counted once) took 8.0 s" in time_line(manifest)


def test_an_open_loop_session_is_judged_on_ttft(tmp_path):
    """The golden runs as an open loop: tok/s is then the arrival rate, so vs baseline and the
    verdicts judge 1000 / TTFT p50, which these runs hold equal between the arms (their tok/s
    differ by up to 10%)."""
    build_session(tmp_path)
    write_manifest_json(tmp_path, {**MANIFEST, "request_rate": {"c=1": 5.0, "c=16": 40.0}})
    rows = write.write_reports(tmp_path)
    judged = [row for row in rows if row["arm"] == "head"]
    assert judged and all(row["vs_baseline"] == pytest.approx(0.0) for row in judged)
    assert "the verdicts judge TTFT" in (tmp_path / "paired.md").read_text()
    assert "Open loop: tok/s is the arrival rate" in (tmp_path / "summary.md").read_text()
