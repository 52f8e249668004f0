"""gate.tools.served_ratio: one load in process (resident.tools.closed_loop) and through a real
`resident serve` with the gate's load client, the tiny model on the CPU, and the ratio of what
each measured."""

from __future__ import annotations

import json
import math
import os

import pytest

from gate.run.load import LoadSpec, make_prompts
from gate.tools import served_ratio
from resident.config import EngineConfig
from resident.engine.engine import build_engine
from resident.model.config import load_model_config
from resident.tools import closed_loop

CONCURRENCY, PROMPT_LEN, OUTPUT_LEN, REQUESTS = 4, 16, 8, 12


def _measured(tmp_path, capsys, *options: str) -> tuple[dict, dict]:
    """A served_ratio call of the module's load (and `options`) that succeeded: its sections,
    and its comparison rows by what they measure."""
    code = served_ratio.main([
        "--concurrency", str(CONCURRENCY), "--prompt-len", str(PROMPT_LEN),
        "--output-len", str(OUTPUT_LEN), "--requests", str(REQUESTS), *options,
        "--logs", str(tmp_path), "--format", "json"])
    sections = json.loads(capsys.readouterr().out)
    assert code == 0, sections
    return sections, {row["what"]: row for row in sections["comparison"]}


def test_one_call_measures_both_halves_and_their_ratio(tmp_path, capsys):
    allowed = os.sched_getaffinity(0)
    sections, rows = _measured(tmp_path, capsys)
    assert os.sched_getaffinity(0) == allowed  # the client's pinning undone
    assert set(sections) == {"served_ratio", "gap", "comparison", "served_cpu"}
    for half in ("in_process", "served"):  # every request, each with all its tokens
        assert rows["completed"][half] == REQUESTS and rows["failed"][half] == 0
        assert rows["output tokens"][half] == REQUESTS * OUTPUT_LEN
        steps = sum(rows[f"{kind} steps"][half] for kind in ("decode", "prefill", "mixed"))
        assert steps >= OUTPUT_LEN  # each request takes a step a token
        assert rows["tokens a step"][half] == pytest.approx(REQUESTS * OUTPUT_LEN / steps,
                                                            rel=1e-3)
        assert 0 < rows["busy share"][half] <= 1
        assert rows["TTFT p50 ms"][half] > 0 and rows["ITL p50 ms"][half] > 0
        assert rows["prefix hits"][half] == rows["prefix saved tokens"][half] == 0  # cache off
    summary, gap = sections["served_ratio"], sections["gap"]
    served, in_process = rows["output tok/s"]["served"], rows["output tok/s"]["in_process"]
    assert (summary["served_tok_s"], summary["in_process_tok_s"]) == (served, in_process)
    assert summary["ratio"] == gap["tok_s_ratio"] == round(served / in_process, 4)
    factors = [gap[f"{factor}_ratio"] for factor in served_ratio.FACTORS]
    assert math.prod(factors) == pytest.approx(summary["ratio"], rel=2e-3)
    assert summary["same_engine"] and summary["requests"] == REQUESTS
    assert summary["warmup_requests"] == CONCURRENCY and summary["planning_mode"] == "resident"
    assert sections["served_cpu"]["client_processes"] == 1
    assert sections["served_cpu"]["server_tracebacks"] == 0
    assert "planning mode: resident" in (tmp_path / "in_process.log").read_text()
    assert "ready: planning mode resident" in (tmp_path / "server.log").read_text()


def test_both_halves_hit_a_shared_prefix_alike(tmp_path, capsys):
    """A 32-token prefix opens every prompt and the cache snapshots every 2 pages: after the
    warm-up, every measured request restores the prefix, in process as served."""
    sections, rows = _measured(tmp_path, capsys, "--shared-prefix-len", "32", "--set",
                               "prefix_cache=on", "--set", "prefix_snapshot_interval=2")
    assert sections["served_ratio"]["shared_prefix_len"] == 32
    for half in ("in_process", "served"):
        assert rows["prefix hits"][half] == REQUESTS
        assert rows["prefix saved tokens"][half] == 32 * REQUESTS


def test_the_closed_loop_runs_every_prompt_and_fails_a_bad_one_alone():
    model = load_model_config("tiny")
    engine = build_engine(model, EngineConfig(), "cpu")
    spec = LoadSpec(2, 5, PROMPT_LEN, 4, vocab_size=model.vocab_size)
    prompts = make_prompts(spec, 5, salt=2)
    prompts[2] = [model.vocab_size] * PROMPT_LEN  # outside the vocabulary: refused at add
    loop = closed_loop.ClosedLoop(engine, prompts, 4, 2, "t")
    wall_s = loop.run()
    assert wall_s > 0 and not loop.live and not engine.requests
    ok = [result for result in loop.results if result["ok"]]
    failed = [result for result in loop.results if not result["ok"]]
    assert len(ok) == 4 and all(r["output_tokens"] == 4 and len(r["itl_s"]) == 3 for r in ok)
    assert all(0 < r["ttft_s"] <= r["latency_s"] <= wall_s for r in ok)
    assert len(failed) == 1 and "prompt token ids" in failed[0]["error"]
    stats = engine.stats()
    assert stats["generated_tokens"] == 16
    assert sum(stats["steps"].values()) >= 16 / 2  # never more than 2 rows a step


def test_an_open_loop_adds_each_prompt_at_its_arrival():
    """Arrivals 0.5 s apart on 2 slots: each prompt waits for its time (the loop idles in
    between), finds a slot free, and its clock starts at its arrival; three arriving at once
    on one slot: two wait, each from the step that freed the slot."""
    model = load_model_config("tiny")
    engine = build_engine(model, EngineConfig(), "cpu")
    spec = LoadSpec(2, 4, PROMPT_LEN, 4, vocab_size=model.vocab_size)
    loop = closed_loop.ClosedLoop(engine, make_prompts(spec, 4, salt=2), 4, 2, "o",
                                  [0.0, 0.5, 0.5, 1.0])
    wall_s = loop.run()
    assert wall_s >= 1.0 and loop.num_waited == 0
    assert [r["ok"] for r in loop.results] == [True] * 4
    assert all(0 < r["ttft_s"] < 0.5 for r in loop.results)
    burst = closed_loop.ClosedLoop(engine, make_prompts(spec, 3, salt=3), 4, 1, "b",
                                   [0.0, 0.0, 0.0])
    burst.run()
    assert burst.num_waited == 2 and all(r["ok"] for r in burst.results)


def test_one_call_measures_an_open_loop_in_both_halves(tmp_path, capsys):
    sections, rows = _measured(tmp_path, capsys, "--request-rate", "40")
    assert sections["served_ratio"]["request_rate"] == 40
    for half in ("in_process", "served"):
        assert rows["completed"][half] == REQUESTS and rows["failed"][half] == 0
        assert rows["requests that waited for a slot"][half] >= 0
        # 12 arrivals at 40 a second: the last comes after ~0.3 s, so a run lasts that long
        assert rows["wall s"][half] >= 0.8 * 11 / 40


@pytest.mark.parametrize(("args", "named"), [
    (["--concurrency", "0"], "argument --concurrency: must be >= 1, got 0"),
    (["--requests", "-1"], "argument --requests: must be >= 0, got -1"),
    (["--shared-prefix-len", "-2"], "argument --shared-prefix-len: must be >= 0, got -2"),
    (["--request-rate", "-1"], "--request-rate must be >= 0 and finite, got -1.0"),
    (["--set", "bogus=1"], "unknown knob 'bogus'"),
    (["--model", "nope"], "unknown model 'nope'"),
    (["--server-cpus", "4096"], "--server-cpus 4096"),
])
def test_a_bad_option_is_named_before_anything_starts(args, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        served_ratio.main(args)
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize("data", [{"warmup": [[1, 2]]},
                                  {"measured": [[1], [2]], "arrivals": [0.0]},
                                  {"measured": [[1], [2]], "arrivals": [0.5, 0.1]}])
def test_the_closed_loop_names_a_bad_prompts_file(tmp_path, capsys, data):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(data))
    with pytest.raises(SystemExit) as exit_info:
        closed_loop.main(["tiny", "--prompts", str(prompts), "--json", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    assert f"--prompts {prompts}" in capsys.readouterr().err


def test_a_half_that_cannot_run_is_reported_without_a_table(tmp_path, capsys):
    """A server not ready in time: one line naming the half and why, the log's end, exit 1."""
    code = served_ratio.main(["--startup-timeout", "0.3", "--logs", str(tmp_path),
                              "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.startswith("served_ratio: served: not ready within 0 s")
