"""gate.tools.api_profile against the tiny model on the CPU, with the synthetic decode
(resident/tools/synthetic_core.py): a real `resident serve` whose core skips the decode forward
streams every token of every request, and the tool reports the API's and the core's CPU."""

from __future__ import annotations

import json

import pytest

from gate.tools import api_profile


def test_the_synthetic_decode_streams_every_token(capsys):
    # 4,096 tokens: at ~10-20 µs each the API's CPU spans several of /proc's 10 ms ticks
    code = api_profile.main(["--synthetic-decode", "--concurrency", "16", "--requests", "64",
                             "--output-len", "64", "--format", "json"])
    out = capsys.readouterr().out
    result = json.loads(out[:out.rindex("}") + 1])["api_profile"]
    assert code == 0
    assert (result["requests_ok"], result["failed"], result["tokens"]) == (64, 0, 64 * 64)
    assert result["api_us_per_token"] > 0 and result["core_cores"] > 0
    assert result["api_processes"] == 1


@pytest.mark.parametrize("args", [["--step-ms", "1"], ["--synthetic-decode", "--step-ms", "-1"]])
def test_a_bad_step_ms_is_refused_naming_it(args, capsys):
    with pytest.raises(SystemExit):
        api_profile.main(args)
    assert "--step-ms" in capsys.readouterr().err
