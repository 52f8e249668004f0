"""The API process without an engine: request validation, the tokenizers, and the HTTP routes
in front of a real EngineClient, answered by a scripted stand-in for the core process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import AsyncIterator

import pytest
import tokenizers
import zmq
import zmq.asyncio
from aiohttp.test_utils import TestClient, TestServer
from tokenizers import decoders, models, pre_tokenizers

from resident.server.api import ApiError, create_app, parse_completion_request
from resident.server.client import EngineClient
from resident.server.protocol import (
    FINISH_ERROR,
    FINISH_LENGTH,
    AbortRequest,
    AddRequest,
    Ready,
    RequestOutput,
    SamplingParams,
    StatsQuery,
    StatsReply,
    StepOutputs,
)
from resident.server.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

VOCAB = 512
MAX_LEN = 64
MODEL = "tiny"
BYTES = ByteTokenizer(VOCAB)


def parse(body):
    return parse_completion_request(body, BYTES, MODEL, VOCAB, MAX_LEN)


# -- parse_completion_request ----------------------------------------------------------------


def test_defaults_are_greedy_sixteen_tokens():
    prompt_ids, params, stream, include_usage = parse({"prompt": "hi"})
    assert prompt_ids == [104, 105]
    assert params == SamplingParams(max_tokens=16)
    assert params.temperature == 0.0 and params.top_k == 0 and params.top_p == 1.0
    assert (stream, include_usage) == (False, False)


def test_every_field_reaches_the_sampling_params():
    body = {"prompt": [1, 2, 3], "model": MODEL, "max_tokens": 5, "temperature": 0.7,
            "top_p": 0.9, "top_k": 40, "seed": 7, "ignore_eos": True,
            "stop_token_ids": [4, 5], "stream": True, "stream_options": {"include_usage": True}}
    prompt_ids, params, stream, include_usage = parse(body)
    assert prompt_ids == [1, 2, 3]
    assert params == SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, top_k=40, seed=7,
                                    ignore_eos=True, stop_token_ids=(4, 5))
    assert stream and include_usage


def test_what_openai_clients_send_is_accepted():
    body = {"prompt": "x", "max_tokens": 4, "temperature": 1, "logprobs": None, "echo": False,
            "n": 1, "best_of": 1, "user": "me", "stop": None, "presence_penalty": 0.0,
            "frequency_penalty": 0, "repetition_penalty": 1.0, "logit_bias": {},
            "stream_options": None, "seed": None, "top_p": None}
    _, params, _, _ = parse(body)
    assert params == SamplingParams(max_tokens=4, temperature=1.0)


@pytest.mark.parametrize("top_k", [-1, VOCAB, VOCAB + 5])
def test_top_k_that_keeps_every_token_is_off(top_k):
    assert parse({"prompt": "x", "top_k": top_k}).params.top_k == 0


def test_prompt_may_fill_the_context_exactly():
    prompt_ids, params, _, _ = parse({"prompt": [0] * (MAX_LEN - 4), "max_tokens": 4})
    assert len(prompt_ids) + params.max_tokens == MAX_LEN


def test_another_models_name_is_not_found():
    with pytest.raises(ApiError) as info:
        parse({"prompt": "x", "model": "gpt-4"})
    assert (info.value.status, info.value.type) == (404, "not_found_error")
    assert "gpt-4" in info.value.message


@pytest.mark.parametrize(
    "body, names",
    [
        ([1, 2], ["JSON object"]),
        ("prompt", ["JSON object"]),
        ({}, ["'prompt'", "required"]),
        ({"prompt": None}, ["'prompt'", "required"]),
        ({"prompt": ""}, ["'prompt'", "empty"]),
        ({"prompt": []}, ["'prompt'", "empty"]),
        ({"prompt": 5}, ["'prompt'", "5"]),
        ({"prompt": ["a", "b"]}, ["'prompt[0]'", '"a"']),
        ({"prompt": [1, True]}, ["'prompt[1]'", "true"]),
        ({"prompt": [1, 2.0]}, ["'prompt[1]'", "2.0"]),
        ({"prompt": [1, -1]}, ["'prompt[1]'", "-1"]),
        ({"prompt": [VOCAB]}, ["'prompt[0]'", str(VOCAB)]),
        ({"prompt": [0] * 60, "max_tokens": 5}, ["60", "5", "65", str(MAX_LEN)]),
        ({"prompt": "x", "max_tokens": 0}, ["'max_tokens'", "0"]),
        ({"prompt": "x", "max_tokens": -3}, ["'max_tokens'", "-3"]),
        ({"prompt": "x", "max_tokens": 3.0}, ["'max_tokens'", "3.0"]),
        ({"prompt": "x", "max_tokens": True}, ["'max_tokens'", "true"]),
        ({"prompt": "x", "max_tokens": "8"}, ["'max_tokens'", '"8"']),
        ({"prompt": "x", "temperature": -0.1}, ["'temperature'", "-0.1"]),
        ({"prompt": "x", "temperature": "hot"}, ["'temperature'", "hot"]),
        ({"prompt": "x", "temperature": float("nan")}, ["'temperature'", "NaN"]),
        ({"prompt": "x", "temperature": 10**400}, ["'temperature'"]),
        ({"prompt": "x", "top_p": 0}, ["'top_p'", "0"]),
        ({"prompt": "x", "top_p": 1.5}, ["'top_p'", "1.5"]),
        ({"prompt": "x", "top_p": False}, ["'top_p'", "false"]),
        ({"prompt": "x", "top_k": -2}, ["'top_k'", "-2"]),
        ({"prompt": "x", "top_k": 2.5}, ["'top_k'", "2.5"]),
        ({"prompt": "x", "seed": "7"}, ["'seed'", '"7"']),
        ({"prompt": "x", "seed": 1.0}, ["'seed'", "1.0"]),
        ({"prompt": "x", "seed": 2**64}, ["'seed'"]),
        ({"prompt": "x", "ignore_eos": 1}, ["'ignore_eos'", "1"]),
        ({"prompt": "x", "stream": "yes"}, ["'stream'", "yes"]),
        ({"prompt": "x", "stream_options": []}, ["'stream_options'"]),
        ({"prompt": "x", "stream_options": {"include_usage": 1}}, ["'include_usage'", "1"]),
        ({"prompt": "x", "stop_token_ids": 5}, ["'stop_token_ids'", "5"]),
        ({"prompt": "x", "stop_token_ids": [1, "2"]}, ["'stop_token_ids[1]'", '"2"']),
        ({"prompt": "x", "stop_token_ids": [VOCAB]}, ["'stop_token_ids[0]'", str(VOCAB)]),
        ({"prompt": "x", "model": 3}, ["'model'", "3"]),
        ({"prompt": "x", "n": 2}, ["'n'", "2"]),
        ({"prompt": "x", "logprobs": 1}, ["'logprobs'", "1"]),
        ({"prompt": "x", "logprobs": 0}, ["'logprobs'", "0"]),
        ({"prompt": "x", "echo": True}, ["'echo'", "true"]),
        ({"prompt": "x", "stop": ["\n"]}, ["'stop'"]),
        ({"prompt": "x", "best_of": 2}, ["'best_of'", "2"]),
        ({"prompt": "x", "presence_penalty": 0.5}, ["'presence_penalty'", "0.5"]),
    ],
)
def test_bad_input_is_a_400_naming_the_field(body, names):
    with pytest.raises(ApiError) as info:
        parse(body)
    assert (info.value.status, info.value.type) == (400, "invalid_request_error")
    for name in names:
        assert name in info.value.message, (name, info.value.message)


def test_string_prompt_ids_are_checked_against_the_vocabulary():
    with pytest.raises(ApiError, match="'prompt' encodes to token 104"):
        parse_completion_request({"prompt": "hi"}, ByteTokenizer(512), MODEL, 100, MAX_LEN)


# -- tokenizers -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["Hello, world!\n", "héllo wörld — 中文 🙂"])
def test_bytes_round_trip(text):
    ids = BYTES.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert BYTES.decode(ids) == text


def test_bytes_show_ids_past_255():
    assert BYTES.decode([104, 300, 105, 511]) == "h<|300|>i<|511|>"
    assert BYTES.decode([0xE4, 300]) == "\ufffd<|300|>"


def test_bytes_need_a_byte_sized_vocabulary():
    with pytest.raises(ValueError, match="vocab_size >= 256, got 255"):
        ByteTokenizer(255)
    with pytest.raises(ValueError, match="vocab_size"):
        load_tokenizer(None, 100)


def _stream_text(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode_delta(ids[: i + 1], i, final=i == len(ids) - 1)
            for i in range(len(ids))]


def test_decode_delta_concatenates_to_the_full_text():
    ids = BYTES.encode("ab 中文🙂") + [300] + BYTES.encode("z")
    deltas = _stream_text(BYTES, ids)
    assert "".join(deltas) == BYTES.decode(ids)
    assert deltas[:3] == ["a", "b", " "]
    # A character's first bytes are held back until the byte that completes it.
    assert deltas[3:6] == ["", "", "中"]
    assert deltas[-2:] == ["<|300|>", "z"]


def test_decode_delta_flushes_an_incomplete_character_at_the_end():
    ids = BYTES.encode("a") + [0xE4, 0xB8]
    assert _stream_text(BYTES, ids) == ["a", "", "\ufffd"]
    assert BYTES.decode_delta(ids, len(ids), final=True) == "\ufffd"
    assert BYTES.decode_delta(ids, 1) == ""


def _byte_level_tokenizer(directory) -> str:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: i for i, char in enumerate(sorted(alphabet))}
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    path = str(directory / "tokenizer.json")
    tokenizer.save(path)
    return path


def test_a_checkpoint_tokenizer_json_is_used(tmp_path):
    path = _byte_level_tokenizer(tmp_path)
    tokenizer = load_tokenizer(str(tmp_path), VOCAB)
    assert isinstance(tokenizer, HFTokenizer) and tokenizer.name == path
    text = "hi 中文"
    ids = tokenizer.encode(text)
    assert len(ids) == len(text.encode("utf-8")) and tokenizer.decode(ids) == text
    assert "".join(_stream_text(tokenizer, ids)) == text


def test_a_directory_without_tokenizer_json_gets_bytes(tmp_path):
    assert load_tokenizer(str(tmp_path), VOCAB).name == "bytes"


# -- HTTP routes --------------------------------------------------------------------------------

INFO = {"model": MODEL, "max_model_len": MAX_LEN, "vocab_size": VOCAB, "eos_token_ids": [0],
        "knobs": {"page_size": 16}}
STATS = {"num_running": 1, "num_waiting": 2, "kv_pages_used": 3, "kv_pages_free": 4,
         "steps": {"decode": 5, "prefill": 6, "mixed": 7}, "generated_tokens": 8, "aborts": 9,
         "new_thing": 1.5, "not a metric name": 1, "text": "skip me"}
NEVER_FITS = 1  # a prompt starting with this id gets the core's never-fits error


class FakeCore:
    """Stands in for the engine-core process at the ZMQ seam: reports Ready, answers stats,
    and generates max_tokens tokens (prompt[0] + 1, + 2, ...) one every `delay` seconds."""

    def __init__(self, request_addr: str, output_addr: str, delay: float) -> None:
        self.context = zmq.asyncio.Context()
        self.requests = self.context.socket(zmq.PULL)
        self.requests.connect(request_addr)
        self.outputs = self.context.socket(zmq.PUSH)
        self.outputs.connect(output_addr)
        self.delay = delay
        self.aborted: asyncio.Queue[str] = asyncio.Queue()
        self.tasks: dict[str, asyncio.Task] = {}

    async def serve(self) -> None:
        await self.outputs.send_pyobj(Ready(INFO))
        while True:
            message = await self.requests.recv_pyobj()
            if isinstance(message, AddRequest):
                task = asyncio.create_task(self._generate(message))
                self.tasks[message.request_id] = task
            elif isinstance(message, AbortRequest):
                self.tasks.pop(message.request_id).cancel()
                self.aborted.put_nowait(message.request_id)
            elif isinstance(message, StatsQuery):
                await self.outputs.send_pyobj(StatsReply(message.nonce, STATS))

    async def _generate(self, request: AddRequest) -> None:
        first = request.prompt_token_ids[0]
        if first == NEVER_FITS:
            await self._send(RequestOutput(request.request_id, [], True, FINISH_ERROR,
                                           "request can never fit the KV pool"))
            return
        count = request.params.max_tokens
        for i in range(1, count + 1):
            await asyncio.sleep(self.delay)
            await self._send(RequestOutput(request.request_id, [first + i], i == count,
                                           FINISH_LENGTH if i == count else None))

    async def _send(self, output: RequestOutput) -> None:
        await self.outputs.send_pyobj(StepOutputs([output]))

    def close(self) -> None:
        self.requests.close(linger=0)
        self.outputs.close(linger=0)
        self.context.term()


@contextlib.asynccontextmanager
async def api(core: bool = False, api_key: str | None = None,
              delay: float = 0.0) -> AsyncIterator[tuple[TestClient, FakeCore | None]]:
    """An API server on a real EngineClient, with a FakeCore attached if `core`."""
    with tempfile.TemporaryDirectory(prefix="rapi") as directory:
        addrs = (f"ipc://{directory}/requests", f"ipc://{directory}/outputs")
        client = EngineClient(*addrs)
        client.start()
        fake = FakeCore(*addrs, delay) if core else None
        serving = asyncio.create_task(fake.serve()) if fake else None
        if fake:
            await client.wait_ready()
        http = TestClient(TestServer(create_app(client, BYTES, MODEL, api_key)))
        await http.start_server()
        try:
            yield http, fake
        finally:
            await http.close()
            await client.close()
            if serving:
                serving.cancel()
                fake.close()


def run(coroutine_function):
    """Runs an async test body (no pytest-asyncio here)."""
    return asyncio.run(coroutine_function())


def test_health_says_starting_and_engine_routes_say_unavailable():
    async def body():
        async with api() as (http, _):
            response = await http.get("/health")
            assert response.status == 503 and await response.json() == {"status": "starting"}
            for method, path in [("get", "/v1/models"), ("get", "/metrics"),
                                 ("get", "/debug/config"), ("post", "/v1/completions")]:
                response = await getattr(http, method)(path)
                assert response.status == 503, path
                assert (await response.json())["error"]["type"] == "service_unavailable"
    run(body)


def test_an_api_key_guards_everything_but_health():
    async def body():
        async with api(api_key="sekrit") as (http, _):
            assert (await http.get("/health")).status == 503
            for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}]:
                response = await http.get("/v1/models", headers=headers)
                assert response.status == 401
                assert (await response.json())["error"]["type"] == "authentication_error"
            response = await http.get("/v1/models", headers={"Authorization": "Bearer sekrit"})
            assert response.status == 503
    run(body)


def test_ready_routes_report_the_core():
    async def body():
        async with api(core=True) as (http, _):
            assert await (await http.get("/health")).json() == {"status": "ok"}
            models = await (await http.get("/v1/models")).json()
            assert models["data"] == [{"id": MODEL, "object": "model", "owned_by": "resident",
                                       "max_model_len": MAX_LEN, "vocab_size": VOCAB}]
            config = await (await http.get("/debug/config")).json()
            assert config == {**INFO, "tokenizer": "bytes"}
    run(body)


def test_metrics_expose_the_core_stats():
    async def body():
        async with api(core=True) as (http, _):
            await http.get("/health")
            response = await http.get("/metrics")
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=")
            text = await response.text()
            for line in ['resident_requests_running 1.0', 'resident_kv_pages_free 4.0',
                         'resident_steps_total{kind="decode"} 5.0',
                         'resident_steps_total{kind="mixed"} 7.0',
                         'resident_generated_tokens_total 8.0', 'resident_aborts_total 9.0',
                         'resident_new_thing 1.5',
                         'resident_http_requests_total{code="200",route="/health"} 1.0']:
                assert line in text.splitlines(), line
            assert "not a metric" not in text and "skip me" not in text
    run(body)


def test_a_completion_returns_text_ids_and_usage():
    async def body():
        async with api(core=True) as (http, _):
            response = await http.post("/v1/completions", json={"prompt": "a", "max_tokens": 3})
            assert response.status == 200
            result = await response.json()
            assert result["object"] == "text_completion" and result["model"] == MODEL
            assert result["id"].startswith("cmpl-")
            assert result["choices"] == [{"index": 0, "text": "bcd", "token_ids": [98, 99, 100],
                                          "finish_reason": "length", "logprobs": None}]
            assert result["usage"] == {"prompt_tokens": 1, "completion_tokens": 3,
                                       "total_tokens": 4}
    run(body)


async def _events(response) -> list:
    events = []
    async for line in response.content:
        if line.strip():
            assert line.startswith(b"data: ")
            payload = line[len(b"data: "):].strip()
            events.append(payload.decode() if payload == b"[DONE]" else json.loads(payload))
    return events


def test_a_stream_sends_one_event_per_token_then_usage_and_done():
    async def body():
        async with api(core=True) as (http, _):
            request = {"prompt": [ord("a")], "max_tokens": 3, "stream": True,
                       "stream_options": {"include_usage": True}}
            response = await http.post("/v1/completions", json=request)
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/event-stream"
            events = await _events(response)
            assert events[-1] == "[DONE]"
            tokens, usage = events[:3], events[3]
            assert [e["choices"][0]["text"] for e in tokens] == ["b", "c", "d"]
            assert [e["choices"][0]["token_ids"] for e in tokens] == [[98], [99], [100]]
            assert [e["choices"][0]["finish_reason"] for e in tokens] == [None, None, "length"]
            assert len({e["id"] for e in events[:-1]}) == 1
            assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    run(body)


def test_a_client_that_leaves_mid_stream_aborts_its_request():
    async def body():
        async with api(core=True, delay=0.02) as (http, core):
            request = {"prompt": "a", "max_tokens": 40, "stream": True}
            response = await http.post("/v1/completions", json=request)
            first = await response.content.readline()
            assert first.startswith(b"data: ")
            response.close()
            aborted = await asyncio.wait_for(core.aborted.get(), 5)
            assert aborted.startswith("cmpl-")
            # The server carries on.
            response = await http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
            assert (await response.json())["choices"][0]["text"] == "bc"
    run(body)


def test_a_request_that_can_never_fit_is_a_400():
    async def body():
        async with api(core=True) as (http, _):
            for stream in (False, True):
                request = {"prompt": [NEVER_FITS], "stream": stream}
                response = await http.post("/v1/completions", json=request)
                assert response.status == 400
                error = (await response.json())["error"]
                assert error["type"] == "invalid_request_error"
                assert error["message"].startswith("request can never fit")
    run(body)


def test_bad_requests_are_400s_and_the_server_carries_on():
    async def body():
        async with api(core=True) as (http, _):
            for data in [b"{not json", b"[1, 2]", b"[" * 100_000, b"\xff\xfe"]:
                response = await http.post("/v1/completions", data=data)
                assert response.status == 400, data[:10]
                assert (await response.json())["error"]["type"] == "invalid_request_error"
            response = await http.post("/v1/completions", json={"prompt": "a", "model": "x"})
            assert response.status == 404
            response = await http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
            assert (await response.json())["choices"][0]["text"] == "b"
    run(body)
