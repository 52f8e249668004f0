"""`python -m resident.tools.bench_host` runs both planning modes on CPU and reports each cell."""

from __future__ import annotations

import json

import pytest

from resident.tools.bench_host import main


def test_reports_off_and_auto_for_each_concurrency(capsys):
    assert main(["--concurrency", "1,3", "--steps", "5", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["host_time_per_decode_step"]
    assert [row["concurrency"] for row in rows] == [1, 3]
    for row in rows:
        assert row["off_us"] > 0 and row["auto_us"] > 0
        assert row["auto_minus_off_us"] == pytest.approx(row["auto_us"] - row["off_us"], abs=0.2)


def test_a_bad_concurrency_is_named(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--concurrency", "1,x"])
    assert exit_info.value.code == 2
    assert "--concurrency '1,x'" in capsys.readouterr().err
