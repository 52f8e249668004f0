"""The chat API on a CUDA server (qwen3.5-0.8b, random weights: the byte tokenizer and the
ChatML fallback template), with CUDA graphs and resident planning at their defaults: greedy
choices of one request identical, streamed text equal to the whole answer, a stop string split
across tokens cut and its request aborted, and 16 streamed requests of n=4 sampled choices
(64 engine requests at once) each finishing with every token and the usage chunk. Raw HTTP
(aiohttp), since the GPU host has no `openai` package.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from server_fixture import Server, post, run, sse_events, stop_across_tokens

pytestmark = pytest.mark.gpu
MODEL = "qwen3.5-0.8b"
CHAT = "/v1/chat/completions"


def messages(i: int) -> list[dict]:
    return [{"role": "system", "content": "Answer in one line."},
            {"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]


@pytest.fixture(scope="module")
def server():
    srv = Server(model=MODEL, device="cuda").wait_ready(timeout_s=400)
    yield srv
    srv.stop()


def chat(server, **body) -> dict:
    status, data = run(post(server.url + CHAT, {"ignore_eos": True, **body}))
    assert status == 200, data
    return data


def stream_chat(server, **body) -> list[dict]:
    async def go():
        async with aiohttp.ClientSession() as session:
            return await sse_events(session, server.url + CHAT,
                                    {"ignore_eos": True, "stream": True, **body})
    return run(go())


def test_greedy_choices_are_identical_and_streams_equal_the_answer(server):
    whole = chat(server, messages=messages(1), max_tokens=48, n=4)
    texts = [c["message"]["content"] for c in whole["choices"]]
    assert len(set(texts)) == 1 and texts[0]
    assert whole["usage"]["completion_tokens"] == 4 * 48
    # n=4 again: the same four rows in the same buckets, so bf16 rounds the same way (a lone
    # row's bucket-1 GEMMs round otherwise, and random weights leave every token near-tied)
    events = stream_chat(server, messages=messages(1), max_tokens=48, n=4)
    first = [e for e in events if e["choices"] and e["choices"][0]["index"] == 0]
    assert first[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in first) == texts[0]
    assert first[-1]["choices"][0]["finish_reason"] == "length"


def test_a_stop_string_across_tokens_cuts_and_aborts(server):
    # with logprobs every token gets its chunk (its text may be "": a byte held back)
    events = stream_chat(server, messages=messages(2), max_tokens=64, logprobs=True)
    texts = [c["delta"]["content"] for e in events for c in e["choices"] if c["logprobs"]]
    assert len(texts) == 64
    stop, before, num_tokens = stop_across_tokens(texts)
    cut = chat(server, messages=messages(2), max_tokens=64, stop=stop)
    assert cut["choices"][0]["message"]["content"] == before
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] == num_tokens


def test_sixty_four_sampled_choices_stream_to_the_end(server):
    max_tokens = 128

    async def one(session, i):
        return await sse_events(session, server.url + CHAT, {
            "messages": messages(i), "max_tokens": max_tokens, "n": 4, "temperature": 0.7,
            "top_p": 0.9, "seed": i, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}})

    async def all_of_them():
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(one(session, i) for i in range(16)))

    start = time.perf_counter()
    answers = run(all_of_them())
    seconds = time.perf_counter() - start
    for events in answers:
        finishes = {c["index"]: c["finish_reason"] for e in events for c in e["choices"]
                    if c["finish_reason"]}
        assert finishes == {i: "length" for i in range(4)}
        assert events[-1]["choices"] == []
        assert events[-1]["usage"]["completion_tokens"] == 4 * max_tokens
    # for the log, not asserted: the chat path's throughput at c=64 engine requests
    print(f"64 sampled chat choices x {max_tokens} tokens: {64 * max_tokens / seconds:.0f} tok/s "
          f"in {seconds:.1f} s")
