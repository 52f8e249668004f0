"""Fuzzing /v1/completions and /v1/chat/completions on the real server (issues 22, 36): whatever
the body, the answer is a 2xx or a JSON 4xx naming the problem, never a 5xx, a traceback or a
hang; afterwards a good request still completes and the server is healthy."""

from __future__ import annotations

import json

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_fixture import Server, get, post, run

VOCAB_SIZE = 512  # the tiny model's
TIMEOUT = aiohttp.ClientTimeout(total=30)  # a hang fails the example rather than the suite

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=8)
TOKEN_IDS = st.lists(st.integers(-2, VOCAB_SIZE + 2), max_size=12)
# each field either plausible (to get past the checks before it) or any JSON value
FIELDS = {
    "prompt": st.text(max_size=40) | TOKEN_IDS | st.lists(st.text(max_size=5), max_size=3),
    "max_tokens": st.integers(-2, 8) | st.integers(),
    "temperature": st.floats() | st.sampled_from([0, 1e-40, 1e-5, 0.7, 2.0]),
    "top_p": st.floats() | st.sampled_from([0, 0.5, 1]),
    "top_k": st.integers(-3, VOCAB_SIZE + 3) | st.integers(),
    "seed": st.integers(),
    "stream": st.booleans(),
    "ignore_eos": st.booleans(),
    "stop_token_ids": TOKEN_IDS,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "model": st.sampled_from(["tiny", "other"]),
    "n": st.sampled_from([0, 1, 2, 17]),
    "echo": st.booleans(),
    "stop": st.sampled_from(["", "x", [], ["a", "b"], [""]]) | st.text(max_size=3),
}
BODIES = st.fixed_dictionaries({}, optional={name: value | JSON for name, value in FIELDS.items()})
# bodies a client could mean: most complete, some past the checks to the edge cases of sampling
PLAUSIBLE = st.fixed_dictionaries(
    {"prompt": st.text(min_size=1, max_size=40)
     | st.lists(st.integers(0, VOCAB_SIZE - 1), min_size=1, max_size=12),
     "max_tokens": st.integers(1, 8)},
    optional={"temperature": st.sampled_from([0, 1e-40, 1e-5, 0.7, 2.0, 1e30]),
              "top_p": st.floats(1e-9, 1), "top_k": st.integers(-1, VOCAB_SIZE + 3),
              "seed": st.integers(-(2**63), 2**64 - 1), "stream": st.booleans(),
              "ignore_eos": st.booleans(),
              "stop_token_ids": st.lists(st.integers(0, VOCAB_SIZE - 1), max_size=4),
              "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()})})
RAW = (PLAUSIBLE.map(lambda body: json.dumps(body).encode())
       | BODIES.map(lambda body: json.dumps(body).encode())
       | JSON.map(lambda value: json.dumps(value).encode())
       | st.binary(max_size=64))

PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                              "text": st.text(max_size=8) | JSON})
MESSAGE = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "robot"]) | JSON,
    "content": st.text(max_size=20) | st.lists(PART, max_size=3) | JSON})
CHAT_FIELDS = {
    "messages": st.lists(MESSAGE, max_size=4),
    "max_tokens": st.integers(-1, 8),
    "max_completion_tokens": st.integers(-1, 8),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(-1, 21),
    "chat_template_kwargs": st.dictionaries(st.text(max_size=8), JSON, max_size=2),
    "tools": st.sampled_from([None, []]),
    **{name: FIELDS[name] for name in ("temperature", "top_p", "seed", "stream",
                                       "stream_options", "model", "n", "stop")},
}
CHAT_BODIES = st.fixed_dictionaries(
    {}, optional={name: value | JSON for name, value in CHAT_FIELDS.items()})
# chats a client could mean (short: the fuzz server's max_model_len is 64), past the checks to
# n, stop strings, logprobs and streams
GOOD_MESSAGE = st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant"]),
    "content": st.text(max_size=6) | st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": st.text(max_size=3)}), max_size=2)})
CHAT_PLAUSIBLE = st.fixed_dictionaries(
    {"messages": st.lists(GOOD_MESSAGE, min_size=1, max_size=2),
     "max_tokens": st.integers(1, 6)},
    optional={"n": st.integers(1, 3), "stop": st.text(min_size=1, max_size=2),
              "logprobs": st.booleans(), "top_logprobs": st.integers(0, 3),
              "temperature": st.sampled_from([0, 0.7]), "seed": st.integers(0, 9),
              "stream": st.booleans(),
              "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()})})
CHAT_RAW = (CHAT_PLAUSIBLE.map(lambda body: json.dumps(body).encode())
            | CHAT_BODIES.map(lambda body: json.dumps(body).encode()))


@pytest.fixture(scope="module")
def server():
    srv = Server("--set", "max_model_len=64").wait_ready()
    yield srv
    srv.stop()


async def _answer(url: str, data: bytes, route: str = "/v1/completions"
                  ) -> tuple[int, str, str]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session, session.post(
            url + route, data=data,
            headers={"Content-Type": "application/json"}) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


def _check(status: int, content_type: str, text: str) -> None:
    if status == 200 and content_type.startswith("text/event-stream"):
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", text
        assert all("choices" in json.loads(event) for event in events[:-1]), text
        return
    data = json.loads(text)
    if status == 200:
        assert all(c["finish_reason"] in ("length", "stop") for c in data["choices"]), data
        return
    assert status in (400, 404), (status, text)
    assert set(data) == {"error"} and data["error"]["message"], data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=RAW)
def test_any_body_gets_a_2xx_or_a_json_4xx(server, data):
    _check(*run(_answer(server.url, data)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=CHAT_RAW)
def test_any_chat_body_gets_a_2xx_or_a_json_4xx(server, data):
    _check(*run(_answer(server.url, data, "/v1/chat/completions")))


def test_after_the_fuzz_the_server_still_serves(server):
    # runs after the fuzz in file order; alone it checks a fresh server, which holds too
    status, data = run(post(server.url + "/v1/completions",
                            {"prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True}))
    assert status == 200 and len(data["choices"][0]["token_ids"]) == 4
    assert run(get(server.url + "/health"))[0] == 200
    assert server.process.poll() is None
    assert "Traceback" not in server.log()
