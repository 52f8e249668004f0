"""`resident-gate phases` through typer's CliRunner against real tiny CPU servers."""

from __future__ import annotations

import json

import pytest
from test_gate_run import ROOT, SHORT, invoke, servers_left

from gate.config import GateConfig
from gate.manifest import Manifest
from gate.records import PHASES_JSON
from gate.report.phases import COLUMNS, PHASES_MD
from gate.run.phases import PhasesSession, merged


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    out = tmp_path_factory.mktemp("phases") / "session"
    result = invoke("phases", "--arm", "off=.", "--arm", "auto=.",
                    "--set", "off.resident_planning=off", "--concurrency", "1,2",
                    "--out", str(out), "--format", "json", *SHORT)
    return out, result


def test_phases_measures_every_arm_and_cell(session):
    out, result = session
    assert result.exit_code == 0, result.output
    cells = json.loads(result.stdout)["cells"]
    assert cells == json.loads((out / PHASES_JSON).read_text())["cells"]
    assert sorted(cells) == ["c=1", "c=2"]
    for cell in cells.values():
        assert sorted(cell) == ["auto", "off"]
        for arm, measured in cell.items():
            decode = measured["kinds"]["decode"]
            assert measured["enabled"] and measured["failed"] == 0
            assert decode["steps"] > 0 and set(COLUMNS) <= set(decode)
            assert (decode["resident"] > 0) == (arm == "auto")
    manifest = Manifest.read(out).to_dict()
    assert manifest["command_kind"] == "phases"
    assert [a["knobs"].get("phase_timing") for a in manifest["arms"]] == ["on", "on"]
    assert not servers_left(result)


def test_phases_md_has_both_tables(session):
    out, _ = session
    text = (out / PHASES_MD).read_text()
    assert "## Plan thread CPU by phase" in text
    assert "| cell | arm | " + " | ".join(COLUMNS) + " | steps |" in text
    assert "## The plan thread, off against each arm" in text
    for cell in ("c=1", "c=2"):
        assert f"| {cell} | off | " in text
        assert f"| {cell} | auto | " in text  # in both tables
    takes = [line for line in text.splitlines() if line.startswith("| c=") and " -> " in line]
    assert len(takes) == 2  # one row per cell for the one arm against the baseline


def test_phases_refuses_a_used_out_and_bad_values(session):
    out, _ = session
    again = invoke("phases", "--arm", "off=.", "--out", str(out), *SHORT)
    assert again.exit_code != 0 and "already holds a phases session" in again.output
    bad = invoke("phases", "--arm", "off=.", "--concurrency", "0", *SHORT)
    assert bad.exit_code != 0 and "--concurrency" in bad.output


def test_phases_runs_one_server_at_a_time_whatever_the_config_says(tmp_path):
    """A config written for `run --interleave --until-verdict` (the demo's) still measures each
    server alone, one run a cell, its rounds as given and none added for a verdict."""
    config = GateConfig(arms=("main=.",), interleave=True, parallel_start=True, rounds=3, runs=4,
                        until_verdict=True, max_rounds=5, out=str(tmp_path / "phases"))
    session = PhasesSession(config, ROOT, ["phases"])
    assert (session.config.interleave, session.config.parallel_start, session.config.rounds,
            session.config.runs, session.config.until_verdict) == (False, False, 3, 1, False)


def _round(plan: float, steps: int, tok_s: float, prefill: bool = True) -> dict:
    kinds = {"decode": {"plan": plan, "step": 2 * plan, "steps": steps}}
    if prefill:
        kinds["prefill"] = {"plan": 1.0, "step": 5.0, "steps": 1}
    return {"kinds": kinds, "enabled": True, "output_throughput": tok_s, "failed": 0,
            "planner_off": None}


def test_rounds_merge_weighted_by_their_steps():
    """Each kind's ms a step is the rounds' mean weighted by their steps; a kind one round did
    not time is the others'; every round is kept as read."""
    rounds = [_round(0.3, 100, 900.0), _round(0.1, 300, 1100.0, prefill=False)]
    one = merged(rounds)
    assert one["kinds"]["decode"] == {"plan": 0.15, "step": 0.3, "steps": 400}
    assert one["kinds"]["prefill"] == {"plan": 1.0, "step": 5.0, "steps": 1}
    assert one["output_throughput"] == 1000.0 and one["failed"] == 0
    assert one["by_round"] == rounds


def test_a_phase_one_round_lacks_is_the_others_mean_not_a_zero():
    """Rounds of trees that time different phases: a phase missing from a round takes no 0 ms
    from it, so its mean is over the rounds that timed it."""
    rounds = [_round(0.3, 100, 900.0), _round(0.1, 300, 1100.0)]
    rounds[1]["kinds"]["decode"]["graph"] = 0.2
    decode = merged(rounds)["kinds"]["decode"]
    assert decode["graph"] == 0.2 and decode["plan"] == 0.15 and decode["steps"] == 400


def test_phases_over_rounds_alternates_the_arms_and_merges_them(tmp_path):
    """Two rounds: each arm's server started twice (the second round in the other order), each
    round's phases kept, their merge's decode steps the rounds' sum, the plan thread's range in
    the takes table."""
    out = tmp_path / "session"
    result = invoke("phases", "--arm", "off=.", "--arm", "auto=.",
                    "--set", "off.resident_planning=off", "--concurrency", "1", "--rounds", "2",
                    "--out", str(out), "--format", "json", *SHORT)
    assert result.exit_code == 0, result.output
    for arm, measured in json.loads((out / PHASES_JSON).read_text())["cells"]["c=1"].items():
        steps = [one["kinds"]["decode"]["steps"] for one in measured["by_round"]]
        assert len(steps) == 2 and all(steps), arm
        assert measured["kinds"]["decode"]["steps"] == sum(steps)
    manifest = Manifest.read(out).to_dict()
    assert manifest["rounds_run"] == 2
    assert [s["arm"] for s in manifest["timing"]["servers"]] == ["off", "auto", "auto", "off"]
    takes = [line for line in (out / PHASES_MD).read_text().splitlines()
             if line.startswith("| c=1 | auto |") and " -> " in line]
    assert len(takes) == 1 and takes[0].count("[") == 2
    assert not servers_left(result)
