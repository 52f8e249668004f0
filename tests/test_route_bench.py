"""`python -m resident.tools.route_bench` times a step's outputs from the core's packing to
the API's transport write."""

from __future__ import annotations

import json

import pytest

from resident.tools.route_bench import main


def test_reports_both_sides_a_token(capsys):
    assert main(["--streams", "4", "--steps", "20", "--format", "json"]) == 0
    small = json.loads(capsys.readouterr().out)["route_bench"]
    assert main(["--streams", "16", "--steps", "20", "--format", "json"]) == 0
    large = json.loads(capsys.readouterr().out)["route_bench"]
    assert small["core_pack_us_per_token"] > 0 and small["api_route_us_per_token"] > 0
    # each of 12 more streams adds at least its request id ("cmpl-" and 32 hex digits)
    assert large["bytes_per_step"] - small["bytes_per_step"] >= 12 * 37


def test_bad_counts_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--streams", "0"])
    assert exit_info.value.code == 2
    assert "--streams" in capsys.readouterr().err
