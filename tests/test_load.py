"""The gate's load generator against a real tiny server: counts, timings and failures."""

from __future__ import annotations

import dataclasses

import pytest

from gate.load import LoadSpec, make_prompts, run_load

from server_fixture import Server, run


@pytest.fixture(scope="module")
def server():
    srv = Server().wait_ready()
    yield srv
    srv.stop()


def test_a_run_streams_every_token(server):
    spec = LoadSpec(concurrency=4, num_requests=8, prompt_len=24, output_len=6, num_warmup=2,
                    seed=3)
    result = run(run_load(server.url, spec))
    assert (result.num_requests, result.num_failed) == (8, 0)
    assert result.output_tokens == 48
    assert result.output_tok_s == pytest.approx(48 / result.wall_s, rel=1e-3)
    assert result.itl_p50_ms > 0 and result.ttft_p50_ms > 0
    assert result.itl_mean_ms >= 0


def test_failures_are_counted_not_measured(server):
    spec = LoadSpec(concurrency=2, num_requests=3, prompt_len=8, output_len=5000)
    result = run(run_load(server.url, spec))  # past max_model_len: every request is a 400
    assert result.num_failed == 3 and result.output_tokens == 0
    assert result.ttft_p50_ms is None and "HTTP 400" in result.errors[0]


def test_prompts_are_seeded():
    spec = LoadSpec(concurrency=1, num_requests=2, prompt_len=16, vocab_size=100, seed=7)
    assert make_prompts(spec, 2, salt=2) == make_prompts(spec, 2, salt=2)
    assert make_prompts(spec, 2, 2) != make_prompts(dataclasses.replace(spec, seed=8), 2, 2)
    assert all(0 <= t < 100 for p in make_prompts(spec, 2, 2) for t in p)
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        LoadSpec(concurrency=0, num_requests=1)
