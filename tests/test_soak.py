"""gate.tools.soak: a real `resident serve` of the tiny model on the CPU under the soak's load
(shared prefixes, varied lengths, clients hanging up), and its end-of-soak checks."""

from __future__ import annotations

import json

import pytest

from gate.tools import soak


def test_a_short_soak_hits_the_cache_aborts_streams_and_gets_everything_back(capsys):
    code = soak.main(["--duration", "6", "--concurrency", "4", "--prefixes", "2",
                      "--shared-prefix-len", "48", "--prompt-len", "16", "--output-len", "12",
                      "--hang-up-every", "3", "--sample-every", "2", "--format", "json",
                      # a snapshot at the shared prefix's end (3 pages), where hits restore
                      "--set", "prefix_snapshot_interval=3"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0, result["checks"]
    checks = {check["check"]: check for check in result["checks"]}
    assert all(check["ok"] for check in checks.values())
    assert checks["hits"]["got"] > 0 and checks["kv_pages_free"]["got"] > 0
    assert checks["row_check_mismatches"]["got"] == 0  # row_check=on by default
    summary = result["soak"]
    assert summary["clients_hung_up"] > 0 and summary["aborts_after"] > 0
    assert summary["requests_finished"] + summary["clients_hung_up"] == summary["requests_sent"]
    assert result["timeline"] and result["timeline"][0]["running"] > 0


IDLE = {**dict.fromkeys(soak.GAUGES, 0.0), **dict.fromkeys(soak.COUNTERS, 0.0),
        "kv_pages_free": 100.0}


@pytest.mark.parametrize("leak", [
    {"kv_pages_used": 3.0, "kv_pages_free": 97.0},  # a request's pages never returned
    {"gdn_slots_used": 1.0},
    {"running": 1.0},
    {"kv_pages_free": 99.0},  # a cached page that never turns idle
    {"snapshots_used": 65.0},
    {"failed": 1.0},
])
def test_every_leftover_fails_the_soak(leak):
    after = {**IDLE, "hits": 5.0, **leak}
    failed = [c["check"] for c in soak.leftovers(IDLE, after, 64, 0) if not c["ok"]]
    assert failed and set(failed) <= {*leak, "kv_pages_free"}


def test_a_soak_that_never_hit_the_cache_or_mismatched_a_row_fails():
    failed = {c["check"] for c in soak.leftovers(IDLE, IDLE, 64, 2) if not c["ok"]}
    assert failed == {"hits", "row_check_mismatches"}


def test_a_bad_load_is_refused_naming_the_value(capsys):
    with pytest.raises(SystemExit):
        soak.main(["--concurrency", "0"])
    assert "concurrency must be >= 1, got 0" in capsys.readouterr().err
