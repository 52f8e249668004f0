"""gate.tools.api_profile against the tiny model on the CPU, with the synthetic decode
(resident/tools/synthetic_core.py): a real `resident serve` whose core skips the decode forward
streams every token of every request, and the tool reports the API's and the core's CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gate.tools import api_profile


def test_the_synthetic_decode_streams_every_token(capsys):
    # 4,096 tokens: at ~10-20 µs each the API's CPU spans several of /proc's 10 ms ticks
    code = api_profile.main(["--synthetic-decode", "--concurrency", "16", "--requests", "64",
                             "--output-len", "64", "--temperature", "0.7", "--top-p", "0.9",
                             "--format", "json"])
    captured = capsys.readouterr()
    result = json.loads(captured.out)["api_profile"]  # stdout is the JSON alone
    assert "server log: " in captured.err
    assert code == 0
    assert (result["requests_ok"], result["failed"], result["tokens"]) == (64, 0, 64 * 64)
    assert result["api_us_per_token"] > 0 and result["core_cores"] > 0
    assert result["core_us_per_token"] == pytest.approx(
        result["core_cores"] * result["wall_s"] / result["tokens"] * 1e6, rel=0.05)
    assert result["api_processes"] == 1
    assert 0 <= result["api_system_share"] <= 1  # the kernel's part of the API's CPU
    assert result["api_us_per_request"] == pytest.approx(result["api_us_per_token"] * 64,
                                                         rel=0.01)


@pytest.mark.parametrize("args, named", [
    (["--step-ms", "1"], "--step-ms"), (["--synthetic-decode", "--step-ms", "-1"], "--step-ms"),
    (["--prompt-len", "0"], "--prompt-len"), (["--native"], "go with --py-spy"),
    (["--spy", "core"], "go with --py-spy"), (["--spy", "gpu"], "--spy"),
    (["--temperature", "-1"], "--temperature"), (["--top-p", "0"], "--top-p")])
def test_bad_options_are_refused_naming_them(args, named, capsys):
    with pytest.raises(SystemExit):
        api_profile.main(args)
    assert named in capsys.readouterr().err


def test_the_synthetic_servers_api_process_imports_no_torch():
    """The harness's API process is the real one: importing the harness imports no torch."""
    code = ("import sys, resident.tools.synthetic_core; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
