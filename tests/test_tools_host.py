"""The host tools that came out of results/: `resident.tools.host_noise` and
`resident.tools.planning_cost` run on the CPU and report what their docstrings say; the
tools' shared option types (`resident.tool_args`) name a bad value."""

from __future__ import annotations

import argparse
import json
import math
import os

import pytest

from resident import tool_args
from resident.tools import host_noise, planning_cost


def test_noise_rows_of_a_steady_host_read_zero():
    rows = host_noise.noise_rows([100] * 128)
    assert [row["window_s"] for row in rows] == [0.025, 0.05, 0.1, 0.2, 0.4, 0.8]
    assert all(row["cv_pct"] == 0 and row["adjacent_sd_pct"] == 0 for row in rows)


def test_noise_rows_see_a_host_that_jumps_between_two_speeds():
    """Windows alternating 100 and 120 iterations: adjacent 25 ms windows differ by log(1.2)
    every time (sd 0 of a constant ratio), while 50 ms windows, each holding one of each, agree."""
    rows = {row["window_s"]: row for row in host_noise.noise_rows([100, 120] * 32)}
    assert rows[0.025]["cv_pct"] == pytest.approx(100 * math.log(1.2) / 2, abs=0.5)
    assert rows[0.05]["cv_pct"] == 0 and rows[0.05]["adjacent_sd_pct"] == 0


def test_host_noise_reports_both_workloads(capsys):
    cpu = max(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    assert host_noise.main(["--seconds", "0.25", "--cpus", str(cpu), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["host_noise"]
    assert {row["workload"] for row in rows} == {"matmul", "smallops"}
    assert all(row["cpu"] == cpu and row["window_s"] > 0 for row in rows)
    assert os.sched_getaffinity(0) == before


def test_host_noise_names_a_cpu_it_may_not_use(capsys):
    with pytest.raises(SystemExit) as exit_info:
        host_noise.main(["--cpus", "4096"])
    assert exit_info.value.code == 2
    assert "--cpus '4096'" in capsys.readouterr().err


def test_planning_cost_times_both_modes():
    result = planning_cost.measure("tiny", requests=2, output_tokens=4, freeze=False)
    assert result["requests"] == 2
    assert result["off_step_ms_median"] > 0 and result["auto_step_ms_median"] > 0
    assert 0.2 < result["auto_over_off_median"] < 5 and result["auto_over_off_sd"] >= 0


def test_planning_cost_refuses_no_requests(capsys):
    with pytest.raises(SystemExit) as exit_info:
        planning_cost.main(["--requests", "0"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize(("text", "message"), [("0", "must be >= 1, got 0"),
                                                ("two", "expected an integer, got 'two'")])
def test_a_count_option_names_itself_and_the_bad_value(text, message, capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=tool_args.count)
    parser.add_argument("--skip", type=tool_args.non_negative, default=0)
    with pytest.raises(SystemExit):
        parser.parse_args(["--steps", text])
    assert f"argument --steps: {message}" in capsys.readouterr().err
    assert parser.parse_args(["--steps", "3", "--skip", "0"]).steps == 3


@pytest.mark.parametrize("text", ["0,4", "1,x", "", "1,,2"])
def test_a_list_of_counts_names_its_option_and_the_bad_list(text, capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=tool_args.counts, default="1,16")
    assert parser.parse_args([]).concurrency == [1, 16]  # a string default goes through it too
    with pytest.raises(SystemExit):
        parser.parse_args(["--concurrency", text])
    assert (f"argument --concurrency: expected positive integers like 1,16,64, got {text!r}"
            in capsys.readouterr().err)
