"""`python -m resident.tools.intake_bench` times each part of a request's intake."""

from __future__ import annotations

import json

import pytest

from resident.tools.intake_bench import main

PARTS = ("api_read_us", "api_validate_us", "api_send_us", "core_receive_us", "core_check_us")


def test_reports_every_part_at_each_prompt_length(capsys):
    assert main(["--prompt-lens", "16,512", "--repeats", "3", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["intake_bench"]
    assert [row["prompt_len"] for row in rows] == [16, 512]
    assert rows[0]["body_bytes"] < rows[1]["body_bytes"]
    assert all(row[part] > 0 for row in rows for part in PARTS)


def test_bad_lengths_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--prompt-lens", "0"])
    assert exit_info.value.code == 2
    assert "--prompt-lens" in capsys.readouterr().err
