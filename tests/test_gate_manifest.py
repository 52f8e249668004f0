"""gate/manifest.py: the typed manifest reads every manifest the gate has written and writes
them back as they were; the summary's notes on a busy host and on too few rounds; the long
session warning."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gate.config import GateConfig
from gate.manifest import HostLoad, Manifest
from gate.report.notes import host_load_lines, next_step_lines
from gate.run.estimate import long_session_warning

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "results").rglob("manifest.json"))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_every_kept_manifest_reads_and_keeps_its_values(path):
    data = json.loads(path.read_text())
    if "sessions" in data:
        data["rounds"] = data.pop("sessions")
    written = Manifest.from_dict(data).to_dict()
    assert {key: written.get(key) for key in data if key != "timing"} == {
        key: value for key, value in data.items() if key != "timing"}
    if data.get("timing") and all("launched_at" in s for s in data["timing"]["servers"]):
        assert written["timing"] == data["timing"]  # a timing from before launched_at gains it


def test_a_check_manifest_has_no_rounds_or_cells():
    check = Manifest(name="c", baseline="main", command_kind="check", yardstick="main-aa")
    assert "rounds" not in check.to_dict() and "cells" not in check.to_dict()
    assert "rounds" in Manifest(name="r", baseline="main").to_dict()


def test_arms_change_by_name_and_differ():
    manifest = Manifest.from_dict({"arms": [{"name": "main"}, {"name": "head"}]})
    changed = manifest.with_arm("head", planner_off=True)
    assert changed.planner_off_arms == {"head"} and not manifest.planner_off_arms
    with pytest.raises(ValueError, match="arm names must differ"):
        Manifest.from_dict({"arms": [{"name": "main"}, {"name": "main"}]})


def test_a_busy_host_is_named_in_the_summary():
    placement = {"server_cpus": [0, 1], "client_cpus": [1]}
    quiet = Manifest(placement=placement, host_load=(HostLoad(0, (0.5, 0.4, 0.3),
                                                               (1.9, 1.0, 0.5), 2),))
    assert host_load_lines(quiet) == []
    busy = Manifest(placement=placement, host_load=(
        HostLoad(0, (0.5, 0.4, 0.3), (1.9, 1.0, 0.5), 2),
        HostLoad(1, (4.9, 3.0, 1.0), (5.2, 3.5, 1.2), 2)))
    line, = host_load_lines(busy)
    assert "reached 5.2 on 2 CPUs" in line and "rounds r2 " in line


def test_too_few_rounds_names_the_next_step():
    rows = [{"cell": "c=1", "arm": "head", "verdict": "too few rounds"},
            {"cell": "c=4", "arm": "head", "verdict": "slower"}]
    fixed = Manifest(rounds=2, rounds_run=2)
    line, = next_step_lines(rows, fixed, Path("results/s"))
    assert "(c=1 head)" in line and "--resume --out results/s --rounds 4" in line
    assert "--until-verdict" in line
    assert next_step_lines(rows[1:], fixed) == []


def test_a_long_cpu_session_is_warned_of_and_the_demo_is_not():
    warning = long_session_warning(GateConfig(arms=("a=.",)), 1)
    assert warning.startswith("warning: this session looks long: about ")
    demo = GateConfig.from_options(ROOT / "configs" / "gate" / "demo-cpu.yaml", {})
    assert long_session_warning(demo, 2) is None
    assert long_session_warning(GateConfig(arms=("a=.",), device="cuda"), 1) is None
    # open loop, a run lasts until its last arrival at least: 16 requests at 0.01 a second
    slow = dataclasses.replace(demo, concurrency=(4,), requests=(16,), request_rate=(0.01,),
                               rounds=1, runs=1)
    assert "about 27 minutes" in long_session_warning(slow, 1)
