"""Phase timing: the PhaseTiming sums, and GET /debug/phases and POST /debug/phases/reset
through `resident serve --model tiny --device cpu`, with the engine's step counts as the
check on what was timed."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from resident.config import build_engine_config
from resident.engine.phases import PLAN_PARTS, REPORT_KEYS, ROLES, PhaseTiming

from server_fixture import Server, get, metrics, post, run, stream

WALL_SLACK_MS = 0.05  # thread CPU clocks tick coarser than perf_counter


def test_phase_timing_files_each_step_under_its_kind():
    phases = PhaseTiming()
    for kind in ("decode", "decode", "prefill", None):
        phases.open()
        phases.open()  # the engine's step inside the core's loop joins the open step
        time.sleep(0.002)  # wall, not CPU
        sum(range(20000))
        phases.lap("kv_plan")
        phases.event_sync(lambda: time.sleep(0.003))
        phases.lap("sample_sync")
        if kind:
            phases.kind(kind)
        phases.close()
        phases.close()
    report = phases.report()
    assert sorted(report) == ["decode", "prefill"]  # the step with no kind is dropped
    decode = report["decode"]
    assert list(decode) == list(REPORT_KEYS)
    assert decode["steps"] == 2 and report["prefill"]["steps"] == 1
    assert decode["event_sync"] >= 3.0
    assert decode["step"] >= 5.0 > decode["kv_plan"] > 0
    assert decode["plan"] == decode["kv_plan"]
    assert decode["gpu"] < decode["step"]
    phases.reset()
    assert phases.report() == {}


def test_work_done_ahead_is_filed_under_its_own_steps_kind():
    """plan_ahead: a decode step stages and launches the mixed step after it; that work (CPU
    and wall) is the mixed step's, and the decode record keeps only its own."""
    phases = PhaseTiming()
    started = time.perf_counter()
    phases.open()
    phases.kind("decode")
    phases.lap("sample_sync")
    with phases.ahead("mixed"):
        time.sleep(0.004)
        sum(range(20000))
        phases.lap("kv_plan")
    assert "mixed" not in phases.report()  # no mixed step has run yet
    phases.close()
    decode_wall_ms = (time.perf_counter() - started) * 1e3
    phases.open()
    phases.kind("mixed")
    phases.lap("sample_sync")
    phases.close()
    report = phases.report()
    decode, mixed = report["decode"], report["mixed"]
    assert decode["kv_plan"] == 0 and mixed["kv_plan"] > 0
    # the 4 ms slept ahead leave the decode record whatever else the machine runs
    assert decode["step"] <= decode_wall_ms - 4.0 + WALL_SLACK_MS
    assert mixed["step"] >= 4.0
    assert decode["steps"] == mixed["steps"] == 1


def test_phase_timing_knob_reads_its_environment_variable():
    assert build_engine_config(environ={"RESIDENT_PHASE_TIMING": "on"}).phase_timing == "on"
    assert build_engine_config(environ={}).phase_timing == "off"
    with pytest.raises(ValueError, match="phase_timing"):
        build_engine_config(environ={"RESIDENT_PHASE_TIMING": "yes"})


@pytest.fixture(scope="module")
def timed():
    server = Server("--set", "phase_timing=on").wait_ready()
    yield server
    server.stop()


def _load(server: Server, count: int, concurrency: int, max_tokens: int = 16) -> None:
    async def drive():
        semaphore = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession() as session:
            async def one(index: int):
                async with semaphore:
                    await stream(session, server.url, {
                        "prompt": [1 + index, 2, 3, 4, 5], "max_tokens": max_tokens,
                        "ignore_eos": True})
            await asyncio.gather(*(one(i) for i in range(count)))
    run(drive())


def _steps(server: Server) -> dict[str, float]:
    samples = run(metrics(server.url))
    return {kind: samples.get(f'resident_steps_total{{kind="{kind}"}}', 0.0)
            for kind in ("decode", "prefill", "mixed")}


def _assert_sensible(row: dict[str, float]) -> None:
    assert list(row) == list(REPORT_KEYS)
    assert all(value >= 0 for value in row.values())
    assert row["event_sync"] <= row["step"]
    # one thread runs every role, so their CPU time fits in the step's wall time
    assert row["main"] + row["gpu"] + row["plan"] <= row["step"] + WALL_SLACK_MS
    assert row["plan"] == pytest.approx(sum(row[part] for part in PLAN_PARTS), abs=1e-3)
    assert all(row[role] > 0 for role in ROLES)


def test_debug_phases_reports_every_key_per_kind_and_resets(timed):
    status, cleared = run(post(timed.url + "/debug/phases/reset", {}))
    assert status == 200 and cleared["enabled"] is True
    assert run(get(timed.url + "/debug/phases")) == (200, {"enabled": True, "kinds": {}})

    before = _steps(timed)
    _load(timed, count=6, concurrency=3)
    after = _steps(timed)
    status, report = run(get(timed.url + "/debug/phases"))
    assert status == 200 and report["enabled"] is True
    kinds = report["kinds"]
    assert "decode" in kinds and ("prefill" in kinds or "mixed" in kinds)
    for kind, row in kinds.items():
        _assert_sensible(row)
        assert row["steps"] == after[kind] - before[kind], kind  # every step, once
    decode = kinds["decode"]
    assert decode["resident"] > 0  # resident planning is on by default
    assert decode["kv_plan"] == 0 and decode["attention"] == 0  # nothing host-planned

    status, read = run(post(timed.url + "/debug/phases/reset", {}))
    assert status == 200 and read["kinds"]["decode"]["steps"] >= decode["steps"]
    assert run(get(timed.url + "/debug/phases"))[1]["kinds"] == {}


def test_host_planned_decode_reports_its_plan_parts():
    server = Server("--set", "phase_timing=on", "--set", "resident_planning=off").wait_ready()
    try:
        _load(server, count=2, concurrency=2)
        decode = run(get(server.url + "/debug/phases"))[1]["kinds"]["decode"]
    finally:
        server.stop()
    _assert_sensible(decode)
    assert decode["resident"] == 0
    for part in ("kv_plan", "kv_stage", "positions", "gdn_linear", "declare_admit_pad"):
        assert decode[part] > 0, part


def test_plan_ahead_files_the_next_steps_plan_under_its_kind():
    server = Server("--set", "phase_timing=on", "--set", "plan_ahead=on").wait_ready()
    try:
        before = _steps(server)
        _load(server, count=4, concurrency=2)
        after = _steps(server)
        kinds = run(get(server.url + "/debug/phases"))[1]["kinds"]
    finally:
        server.stop()
    for kind, row in kinds.items():
        _assert_sensible(row)
        assert row["steps"] == after[kind] - before[kind], kind
    assert kinds["decode"]["resident"] > 0


def test_debug_phases_without_phase_timing_is_empty():
    server = Server().wait_ready()
    try:
        _load(server, count=1, concurrency=1, max_tokens=4)
        assert run(get(server.url + "/debug/phases")) == (200, {"enabled": False, "kinds": {}})
        status, _ = run(post(server.url + "/debug/phases/reset", {}))
        assert status == 200
    finally:
        server.stop()
