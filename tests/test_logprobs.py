"""Logprobs: the engine's per-token log-probabilities against the model's own log-softmax (float64,
in process and through `resident serve`), the OpenAI completions shape the API gives them, and
nothing computed or copied for requests that do not ask."""

from __future__ import annotations

import asyncio
import math

import aiohttp
import pytest
import torch

from resident.config import EngineConfig
from resident.engine.engine import build_engine
from resident.engine.sampler import Sampler, SampleRow
from resident.engine.types import EngineRequest, SamplingParams, TokenLogprobs
from resident.model.config import load_model_config
from resident.server.responses import completion_logprobs
from resident.server.tokenizer import ByteTokenizer

from model_driver import ModelDriver
from server_fixture import Server, post, run, stream

TINY = load_model_config("tiny")


def reference_logprobs(model, prompt: list[int], tokens: list[int]) -> list[torch.Tensor]:
    """The model's log-softmax at each generated token's position, run alone."""
    driver = ModelDriver(model)
    logits = driver.step({"r": prompt})["r"][-1]
    rows = []
    for token in tokens:
        rows.append(torch.log_softmax(logits, dim=-1))
        logits = driver.step({"r": [token]})["r"][-1]
    return rows


def assert_matches(entry: TokenLogprobs, token: int, want: torch.Tensor, count: int) -> None:
    assert entry.logprob == pytest.approx(want[token].item(), abs=1e-12)
    top_values, top_ids = want.topk(count)
    assert [token_id for token_id, _ in entry.top] == top_ids.tolist()
    assert [value for _, value in entry.top] == pytest.approx(top_values.tolist(), abs=1e-12)


def drive(engine, requests: dict[str, tuple[list[int], SamplingParams]]):
    """Every request at once; each one's tokens and its outputs' logprobs, in order."""
    for rid, (prompt, params) in requests.items():
        assert engine.add_request(EngineRequest(rid, prompt, params)) is None
    tokens = {rid: [] for rid in requests}
    logprobs = {rid: [] for rid in requests}
    while engine.has_work():
        for output in engine.step():
            tokens[output.request_id].extend(output.new_token_ids)
            if output.logprobs is None:
                logprobs[output.request_id].append(None)
            else:
                assert len(output.logprobs) == len(output.new_token_ids)
                logprobs[output.request_id].extend(output.logprobs)
    return tokens, logprobs


@pytest.fixture(scope="module")
def engine():
    return build_engine(TINY, EngineConfig(dtype="float64"), "cpu")


def test_a_batch_gets_the_models_own_log_softmax(engine):
    """Greedy rows asking 0, 3 and 20 top logprobs and one asking none share every step."""
    generator = torch.Generator().manual_seed(3)
    asked = {"none": None, "zero": 0, "three": 3, "twenty": 20}
    requests = {rid: (torch.randint(0, TINY.vocab_size, (5 + 7 * i,),
                                    generator=generator).tolist(),
                      SamplingParams(max_tokens=9, ignore_eos=True, logprobs=count))
                for i, (rid, count) in enumerate(asked.items())}
    tokens, logprobs = drive(engine, requests)
    assert logprobs["none"] == [None] * 9
    for rid, count in asked.items():
        if count is None:
            continue
        want = reference_logprobs(engine.model, requests[rid][0], tokens[rid])
        assert len(logprobs[rid]) == len(tokens[rid]) == 9
        for entry, token, row in zip(logprobs[rid], tokens[rid], want, strict=True):
            assert_matches(entry, token, row, count)
            assert entry.top[:1] == ((token, entry.logprob),)[:count]  # greedy: the top one


def test_a_sampled_token_gets_its_own_logprob_from_the_raw_logits(engine):
    """At temperature 1.5 with top-k the token is drawn, often not the top one; its logprob is
    the raw log-softmax's at the drawn id (vLLM's raw logprobs), not the tempered one's."""
    prompt = list(range(40, 60))
    params = SamplingParams(max_tokens=12, temperature=1.5, top_k=50, seed=7, ignore_eos=True,
                            logprobs=2)
    tokens, logprobs = drive(engine, {"drawn": (prompt, params)})
    want = reference_logprobs(engine.model, prompt, tokens["drawn"])
    for entry, token, row in zip(logprobs["drawn"], tokens["drawn"], want, strict=True):
        assert_matches(entry, token, row, 2)
    assert any(entry.top[0][0] != token
               for entry, token in zip(logprobs["drawn"], tokens["drawn"], strict=True))


def test_no_row_asking_means_nothing_computed_or_read_back():
    logits = torch.randn(3, 16, dtype=torch.float64)
    tokens = logits.argmax(dim=-1)
    rows = [SampleRow(f"r{i}", SamplingParams(max_tokens=1), 0) for i in range(3)]
    assert Sampler.logprobs(logits, tokens, rows) is None
    asked = rows[:1] + [SampleRow("r1", SamplingParams(max_tokens=1, logprobs=2), 0)] + rows[2:]
    step = Sampler.logprobs(logits, tokens, asked)
    assert step.rows == (1,) and step.counts == (2,)
    assert step.values.shape == (1, 3) and step.ids.shape == (1, 2)


@pytest.mark.parametrize("count", [-1, 21])
def test_sampling_params_refuse_a_logprobs_count_out_of_range(count):
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(max_tokens=1, logprobs=count)


# -- the OpenAI completions shape -------------------------------------------------------------

BYTES = ByteTokenizer(512)


def test_completion_logprobs_shape_follows_openai_and_vllm():
    entries = [TokenLogprobs(-0.5, ((72, -0.5), (300, -1.25))),
               TokenLogprobs(-2.0, ((105, -0.75), (72, -1.5))),  # sampled outside the top 2
               TokenLogprobs(-math.inf, ())]
    body = completion_logprobs([72, 300, 105], entries, BYTES, 0, tokens_as_ids=False)
    assert body == {
        "tokens": ["H", "<|300|>", "i"],
        "token_logprobs": [-0.5, -2.0, -9999.0],
        # the sampled token first, then the top k: up to k + 1 entries
        "top_logprobs": [{"H": -0.5, "<|300|>": -1.25},
                         {"<|300|>": -2.0, "i": -0.75, "H": -1.5},
                         {"i": -9999.0}],
        "text_offset": [0, 1, 8],
    }
    by_id = completion_logprobs([72, 300], entries[:2], BYTES, 5, tokens_as_ids=True)
    assert by_id["tokens"] == ["token_id:72", "token_id:300"]
    assert list(by_id["top_logprobs"][1]) == ["token_id:300", "token_id:105", "token_id:72"]
    assert by_id["text_offset"] == [5, 6]  # offsets count the text, whatever names the tokens


# -- through the server -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    srv = Server("--set", "dtype=float64").wait_ready()
    yield srv
    srv.stop()


def test_the_api_returns_the_models_log_softmax_streamed_or_not(server, engine):
    prompt, count = "It was the best of times", 4
    body = {"prompt": prompt, "max_tokens": 6, "ignore_eos": True, "logprobs": count,
            "return_tokens_as_token_ids": True}
    status, answer = run(post(server.url + "/v1/completions", body))
    assert status == 200, answer
    choice = answer["choices"][0]
    tokens, logprobs = choice["token_ids"], choice["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in tokens]
    want = reference_logprobs(engine.model, BYTES.encode(prompt), tokens)
    for index, (token, row) in enumerate(zip(tokens, want, strict=True)):
        assert logprobs["token_logprobs"][index] == pytest.approx(row[token].item(), abs=1e-12)
        top_values, top_ids = row.topk(count)
        top = logprobs["top_logprobs"][index]
        assert list(top)[0] == f"token_id:{token}"
        assert {f"token_id:{i}" for i in top_ids.tolist()} <= set(top) and len(top) <= count + 1
        assert [top[f"token_id:{i}"] for i in top_ids.tolist()] == pytest.approx(
            top_values.tolist(), abs=1e-12)

    async def streamed():
        async with aiohttp.ClientSession() as session:
            return await stream(session, server.url, body)

    events = [event["choices"][0] for event in asyncio.run(streamed())]
    assert [e["token_ids"][0] for e in events] == tokens
    for key in ("tokens", "token_logprobs", "top_logprobs"):
        assert [value for e in events for value in e["logprobs"][key]] == logprobs[key]
    # a streamed token's offset is the length of the text sent before it (vLLM's rule)
    sent = [0]
    for event in events:
        sent.append(sent[-1] + len(event["text"]))
    assert [e["logprobs"]["text_offset"][0] for e in events] == sent[:-1]


def test_the_api_leaves_logprobs_null_unless_asked_and_refuses_bad_counts(server):
    status, answer = run(post(server.url + "/v1/completions", {"prompt": "Hi", "max_tokens": 2}))
    assert status == 200 and answer["choices"][0]["logprobs"] is None
    status, answer = run(post(server.url + "/v1/completions",
                              {"prompt": "Hi", "max_tokens": 2, "logprobs": 21}))
    assert status == 400 and "'logprobs'" in answer["error"]["message"]
