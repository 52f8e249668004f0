"""POST /debug/profile on the tiny model through the real server on CPU: torch.profiler with
CPU activity only, so the "kernels" are the step thread's top-level CPU ops."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import aiohttp
import pytest

from resident.profiling.summary import ProfileSummary, summarize
from resident.profiling.torch_trace import from_chrome_trace

from server_fixture import Server, post, run

# long enough to be still decoding when the window opens, on a busy host too (200 tokens were
# sometimes done within the 0.5 s before it)
LOAD = {"prompt": [1, 2, 3], "max_tokens": 2000, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    traces = tmp_path_factory.mktemp("traces")
    srv = Server("--set", f"profile_dir={traces}").wait_ready()
    yield srv, traces
    srv.stop()
    assert "Traceback" not in srv.log()


def test_a_window_under_load_writes_a_trace_and_its_summary(server):
    srv, traces = server

    async def body():
        async with aiohttp.ClientSession() as session:
            load = [asyncio.ensure_future(session.post(srv.url + "/v1/completions", json=LOAD))
                    for _ in range(2)]
            await asyncio.sleep(0.5)
            answer = await post(srv.url + "/debug/profile", {"steps": 6})
            for response in await asyncio.gather(*load):
                response.release()
            return answer

    status, answer = run(body())
    assert status == 200, answer
    assert answer["tool"] == "torch" and answer["steps"] == 6
    trace = Path(answer["trace"])
    assert trace.parent == traces and trace.name.endswith(".json.gz")
    with gzip.open(trace, "rt") as file:
        timeline = from_chrome_trace(json.load(file))
    summary = ProfileSummary.from_dict(answer["summary"])
    assert summary == summarize(timeline)
    assert summary.activity == "cpu" and len(timeline.steps) == 6
    decode = summary.kind("decode")
    assert decode is not None and decode.steps >= 4  # the prompts' prefill may be in it
    assert decode.period_us_mean > 0 and decode.busy_us > 0
    assert any(k.name.startswith("aten::") for k in decode.kernels)


def test_an_idle_window_closes_on_its_seconds_with_no_steps(server):
    srv, _ = server
    status, answer = run(post(srv.url + "/debug/profile", {"steps": 1000, "seconds": 0.5}))
    assert status == 200 and answer["steps"] == 0
    assert answer["summary"]["kinds"] == [] and answer["seconds"] >= 0.5


def test_one_window_at_a_time(server):
    srv, _ = server

    async def body():
        first = asyncio.ensure_future(post(srv.url + "/debug/profile",
                                           {"steps": 1000, "seconds": 1.5}))
        await asyncio.sleep(0.5)
        second = await post(srv.url + "/debug/profile", {"steps": 1})
        return await first, second

    (first_status, _), (second_status, second) = run(body())
    assert first_status == 200
    assert second_status == 409 and "already open" in second["error"]["message"]


@pytest.mark.parametrize("body, names", [
    ({"steps": 0}, ["'steps'", "0"]),
    ({"steps": "5"}, ["'steps'", "'5'"]),
    ({"seconds": 0}, ["'seconds'"]),
    ({"seconds": 1e9}, ["'seconds'", "600"]),
    ({"tool": "perf"}, ["'tool'", "torch, nsys", "'perf'"]),
    ([1], ["JSON object"]),
    ({"tool": "nsys"}, ["nsys needs a CUDA device"]),
])
def test_a_bad_profile_request_is_a_4xx_naming_it(server, body, names):
    srv, _ = server
    status, answer = run(post(srv.url + "/debug/profile", body))
    assert status == 400, answer
    assert all(name in answer["error"]["message"] for name in names), answer
