"""stream_interval: a stream's tokens after its first leave the engine core n at a time
(server/routing.py), its last output taking what is held, an aborted request's held tokens
dropped; served, the same tokens as one at a time, written n events a write."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import zmq

from resident.engine.types import FINISH_ERROR, FINISH_LENGTH, RequestOutput, TokenLogprobs
from resident.server.routing import OutputRouter
from tests.server_fixture import Server, post, run

LOGPROBS = (TokenLogprobs(-0.5, ()),)


def _steps(interval: int, steps: list[list[RequestOutput]],
           aborted: tuple[str, ...] = ()) -> list[list[RequestOutput]]:
    """What one API process receives for each step's outputs through a router of `interval`
    (a request owned as it first appears; those in `aborted` disowned before the third
    step's, as a request the API aborted)."""
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind("inproc://stream-interval")
    router = OutputRouter(context, ["inproc://stream-interval"], 1.0, interval)
    received, owned = [], set()
    try:
        for index, outputs in enumerate(steps):
            for output in outputs:
                if output.request_id not in owned:
                    router.own(output.request_id, 0)
                    owned.add(output.request_id)
            if index == 2:
                for request_id in aborted:
                    router.disown(request_id)
            router.send_outputs(outputs)
            received.append(pull.recv_pyobj().outputs() if pull.poll(100) else [])
    finally:
        router.close(0)
        pull.close(0)
        context.term()
    return received


def test_tokens_after_the_first_go_n_at_a_time_and_the_last_takes_the_rest():
    steps = [[RequestOutput("a", [t])] for t in range(1, 6)]
    steps.append([RequestOutput("a", [6], True, FINISH_LENGTH)])
    received = _steps(3, steps)
    assert received == [[RequestOutput("a", [1])], [], [], [RequestOutput("a", [2, 3, 4])], [],
                        [RequestOutput("a", [5, 6], True, FINISH_LENGTH)]]
    assert _steps(1, steps) == steps  # the default: every output as it is


def test_outputs_that_are_not_a_token_alone_go_at_once_with_what_is_held():
    with_logprobs = [[RequestOutput("b", [t], logprobs=LOGPROBS)] for t in range(3)]
    assert _steps(4, with_logprobs) == with_logprobs
    failing = [[RequestOutput("c", [1])], [RequestOutput("c", [2])],
               [RequestOutput("c", [], True, FINISH_ERROR, "the draw failed")]]
    assert _steps(4, failing)[-1] == [RequestOutput("c", [2], True, FINISH_ERROR,
                                                    "the draw failed")]


def test_an_aborted_requests_held_tokens_are_dropped():
    steps = [[RequestOutput("d", [t]), RequestOutput("e", [t])] for t in range(4)]
    received = _steps(3, steps, aborted=("d",))
    assert [o.request_id for outputs in received for o in outputs] == ["d", "e", "e"]


@pytest.fixture(scope="module")
def grouped():
    srv = Server("--set", "dtype=float64", "--set", "stream_interval=3").wait_ready()
    yield srv
    srv.stop()


async def _chunks(url: str, prompt: list[int], max_tokens: int) -> list[list[int]]:
    """The token ids of each HTTP chunk of a streamed completion, [DONE] left out."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    chunks, pending = [], b""
    async with aiohttp.ClientSession() as session, \
            session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        async for data, end_of_chunk in resp.content.iter_chunks():
            pending += data
            if end_of_chunk:
                chunks.append([int(part.split(b"]")[0]) for part in
                               pending.split(b'"token_ids":[')[1:]])
                pending = b""
    return [chunk for chunk in chunks if chunk]


def test_a_served_stream_comes_in_groups_with_the_same_tokens(grouped):
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8], [1, 6, 1, 8, 0, 3]]

    async def both():
        streamed = await asyncio.gather(*(_chunks(grouped.url, p, 10) for p in prompts))
        whole = await asyncio.gather(*(post(grouped.url + "/v1/completions",
                                            {"prompt": p, "max_tokens": 10, "ignore_eos": True})
                                       for p in prompts))
        return streamed, whole

    streamed, whole = run(both())
    for chunks, (status, answer) in zip(streamed, whole, strict=True):
        assert status == 200
        assert [t for chunk in chunks for t in chunk] == answer["choices"][0]["token_ids"]
        # the first token alone, then three a write ([1, 3, 3, 3]); outputs that came while
        # the response's headers went out are written together, whole groups still
        assert len(chunks[0]) % 3 == 1 and all(len(chunk) % 3 == 0 for chunk in chunks[1:])
