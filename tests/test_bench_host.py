"""`python -m resident.tools.bench_host` runs both planning modes on CPU and reports each cell;
`bench_staging` stages a mixed step at each concurrency; `hit_phases` times prefix hits' host
phases."""

from __future__ import annotations

import json

import pytest
import torch

from resident.config import EngineConfig
from resident.engine.engine import build_engine
from resident.model.config import load_model_config
from resident.tools.bench import Draw, _add_prompts, _prefill
from resident.tools.bench_host import main


def test_reports_off_and_auto_for_each_concurrency(capsys):
    assert main(["--concurrency", "1,3", "--steps", "5", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["host_time_per_decode_step"]
    assert [row["concurrency"] for row in rows] == [1, 3]
    for row in rows:
        assert row["off_us"] > 0 and row["auto_us"] > 0
        assert row["auto_minus_off_us"] == pytest.approx(row["auto_us"] - row["off_us"], abs=0.2)


def test_sampled_rows_and_the_phase_parts_of_each_arm(capsys):
    """--temperature makes every step draw (staged by slot, or uploaded row by row when
    host-planned); --phases adds each arm's sampler, plan and main parts."""
    argv = ["--concurrency", "4", "--steps", "6", "--temperature", "0.7", "--top-p", "0.9",
            "--phases", "--format", "json"]
    assert main(argv) == 0
    [row] = json.loads(capsys.readouterr().out)["host_time_per_decode_step"]
    assert all(row[f"{arm}_{part}_us"] > 0 for arm in ("off", "auto")
               for part in ("sampler", "plan", "main"))


def test_a_bad_draw_and_a_run_longer_than_the_model_are_named(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--top-p", "0"])
    assert exit_info.value.code == 2
    assert "top_p" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--steps 9000: request can never fit"):
        main(["--concurrency", "1", "--steps", "9000"])


def test_a_bad_concurrency_is_named(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--concurrency", "1,x"])
    assert exit_info.value.code == 2
    assert ("argument --concurrency: expected positive integers like 1,16,64, got '1,x'"
            in capsys.readouterr().err)


def test_a_burst_after_an_idle_counts_the_steps_its_prompts_took():
    """The bench's burst rows divide their wall by the prefill steps: a second burst, after
    the engine drained, takes as many as the first (8 prompts of 24 tokens, 64 a step)."""
    config = EngineConfig(plan_ahead="launch", prefill_token_budget=64)
    engine = build_engine(load_model_config("tiny"), config, "cpu")
    counts = []
    for tag in ("first", "steady"):
        _add_prompts(engine, tag, 8, 24, 1)
        counts.append(_prefill(engine)[1])
        while engine.has_work():
            engine.step()
    assert counts == [3, 3]


def test_the_bench_draws_its_decode_rows_as_asked():
    """--temperature / --top-p reach every decode request (seeded by its index); bad values
    are refused by SamplingParams' own checks."""
    engine = build_engine(load_model_config("tiny"), EngineConfig(), "cpu")
    _add_prompts(engine, "drawn", 3, 8, 4, Draw(0.7, 0.9))
    params = [request.params for request in engine.requests.values()]
    assert [(p.temperature, p.top_p, p.seed) for p in params] == [(0.7, 0.9, i) for i in range(3)]
    with pytest.raises(ValueError, match="top_p"):
        Draw(0.7, 0.0)


def test_bench_staging_stages_a_mixed_step_of_each_concurrency(capsys):
    from resident.tools.bench_staging import main as bench_staging

    assert bench_staging(["--concurrency", "2,5", "--repeat", "3", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["mixed_step_staging"]
    assert [(row["concurrency"], row["rows"]) for row in rows] == [(2, 3), (5, 6)]
    assert [row["tokens"] for row in rows] == [514, 517] and all(r["staging_us"] > 0 for r in rows)
    with pytest.raises(SystemExit) as exit_info:
        bench_staging(["--repeat", "0"])
    assert exit_info.value.code == 2


def test_hit_phases_times_hits_that_restore_the_prefix(capsys):
    """Every measured request restores the shared prefix, and its prefill step's staging and
    upload are timed; a bad knob is a usage error naming it."""
    from resident.tools.hit_phases import main as hit_phases

    assert hit_phases(["--prefix-len", "64", "--prompt-len", "16", "--output-len", "2",
                       "--requests", "2", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["hits"] == {"requests": 2, "hits": 2}
    phases = {row["phase"]: row for row in result["phases"]}
    assert phases["steps"]["prefill"] == 2 and phases["kv_stage"]["prefill"] > 0
    ttft = result["ttft_ms"]  # each hit's first token: at least its prefill step's forward
    assert ttft["p90"] >= ttft["p50"] >= phases["gpu"]["prefill"] > 0
    assert hit_phases(["--prefix-len", "64", "--prompt-len", "16", "--output-len", "2",
                       "--requests", "2", "--set", "prefix_cache=off", "--format", "json"]) == 0
    fresh = json.loads(capsys.readouterr().out)  # the same prompts computed whole, no hits
    assert fresh["hits"] == {"requests": 2, "hits": 0} and fresh["ttft_ms"]["p50"] > 0
    with pytest.raises(SystemExit) as exit_info:
        hit_phases(["--set", "prefix_cache=sometimes"])
    assert exit_info.value.code == 2
    assert "prefix_cache" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        hit_phases(["--device", "gpu"])
    assert exit_info.value.code == 2 and "--device" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert hit_phases(["--device", "cuda"]) == 2
        assert "needs a CUDA device" in capsys.readouterr().err
