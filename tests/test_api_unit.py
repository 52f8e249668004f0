"""The API process without an engine: request validation, the tokenizers, and the HTTP routes
in front of a real EngineClient, answered by a scripted stand-in for the core process."""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
from collections.abc import AsyncIterator

import pytest
import tokenizers
from aiohttp.test_utils import TestClient, TestServer
from tokenizers import decoders, models, pre_tokenizers, trainers

from resident.config import EngineConfig
from resident.engine.types import SamplingParams
from resident.server.api import create_app
from resident.server.client import EngineClient
from resident.server.tokenizer import (
    DELTA_CONTEXT,
    ByteTokenizer,
    HFTokenizer,
    load_tokenizer,
)
from resident.server.validation import ApiError, all_in_vocab, parse_completion_request

VOCAB = 512
MAX_LEN = 64
MODEL = "tiny"
BYTES = ByteTokenizer(VOCAB)


def parse(body):
    return parse_completion_request(body, BYTES, MODEL, VOCAB, MAX_LEN)


# -- parse_completion_request ----------------------------------------------------------------


def test_defaults_are_greedy_sixteen_tokens():
    prompt_ids, params, stream, include_usage, tokens_as_ids, stop, n, salt = parse(
        {"prompt": "hi"})
    assert prompt_ids == [104, 105] and stop == () and n == 1 and salt is None
    assert params == SamplingParams(max_tokens=16)
    assert params.temperature == 0.0 and params.top_k == 0 and params.top_p == 1.0
    assert params.logprobs is None
    assert (stream, include_usage, tokens_as_ids) == (False, False, False)


def test_every_field_reaches_the_sampling_params():
    body = {"prompt": [1, 2, 3], "model": MODEL, "max_tokens": 5, "temperature": 0.7,
            "top_p": 0.9, "top_k": 40, "seed": 7, "ignore_eos": True,
            "stop_token_ids": [4, 5], "stream": True, "stream_options": {"include_usage": True},
            "logprobs": 3, "return_tokens_as_token_ids": True, "stop": ["\n", "ab", "\n"],
            "n": 3, "cache_salt": "tenant-a"}
    prompt_ids, params, stream, include_usage, tokens_as_ids, stop, n, salt = parse(body)
    assert prompt_ids == [1, 2, 3] and stop == ("\n", "ab") and n == 3 and salt == "tenant-a"
    assert parse({"prompt": "x", "stop": "end"}).stop == ("end",)
    assert params == SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, top_k=40, seed=7,
                                    ignore_eos=True, stop_token_ids=(4, 5), logprobs=3)
    assert stream and include_usage and tokens_as_ids


def test_what_openai_clients_send_is_accepted():
    body = {"prompt": "x", "max_tokens": 4, "temperature": 1, "logprobs": None, "echo": False,
            "n": 1, "best_of": 1, "user": "me", "stop": None, "presence_penalty": 0.0,
            "frequency_penalty": 0, "repetition_penalty": 1.0, "logit_bias": {},
            "stream_options": None, "seed": None, "top_p": None}
    params = parse(body).params
    assert params == SamplingParams(max_tokens=4, temperature=1.0)
    # vLLM's extensions at their defaults, as its own clients send them
    vllm = {"min_tokens": 0, "prompt_logprobs": None, "use_beam_search": False,
            "length_penalty": 1.0, "include_stop_str_in_output": False,
            "skip_special_tokens": True, "spaces_between_special_tokens": True,
            "allowed_token_ids": None, "bad_words": [], "guided_json": None}
    assert parse({**body, **vllm}).params == params


@pytest.mark.parametrize("top_k", [-1, VOCAB, VOCAB + 5])
def test_top_k_that_keeps_every_token_is_off(top_k):
    assert parse({"prompt": "x", "top_k": top_k}).params.top_k == 0


def test_prompt_may_fill_the_context_exactly():
    prompt_ids, params, *_ = parse({"prompt": [0] * (MAX_LEN - 4), "max_tokens": 4})
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
        # a list of text prompts (a batch, in OpenAI's API) says so, not "not a token id"
        ({"prompt": ["a", "b"]}, ["'prompt'", "list of strings", "one prompt a request"]),
        ({"prompt": [1, "b"]}, ["'prompt'", "list of strings"]),
        ({"prompt": "\ud800 x"}, ["'prompt'", "lone surrogate at index 0"]),
        ({"prompt": [1], "stop_token_ids": [1] * 300}, ["'stop_token_ids'", "300", "256"]),
        ({"prompt": [1, True]}, ["'prompt[1]'", "true"]),
        ({"prompt": [1, 2.0]}, ["'prompt[1]'", "2.0"]),
        ({"prompt": [1, -1]}, ["'prompt[1]'", "-1"]),
        ({"prompt": [VOCAB]}, ["'prompt[0]'", str(VOCAB)]),
        ({"prompt": [1, 2**70]}, ["'prompt[1]'", str(2**70)]),
        ({"prompt": [1, None]}, ["'prompt[1]'", "null"]),
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
        ({"prompt": "x", "min_p": 1.5}, ["'min_p'", "1.5"]),
        ({"prompt": "x", "min_p": "low"}, ["'min_p'", "low"]),
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
        ({"prompt": "x", "n": 17}, ["'n'", "1..16", "17"]),
        ({"prompt": "x", "n": 0}, ["'n'", "0"]),
        ({"prompt": "x", "n": 1.5}, ["'n'", "1.5"]),
        ({"prompt": "x", "logprobs": 21}, ["'logprobs'", "0..20", "21"]),
        ({"prompt": "x", "logprobs": -1}, ["'logprobs'", "-1"]),
        ({"prompt": "x", "logprobs": True}, ["'logprobs'", "true"]),
        ({"prompt": "x", "logprobs": 1.0}, ["'logprobs'", "1.0"]),
        ({"prompt": "x", "return_tokens_as_token_ids": 1},
         ["'return_tokens_as_token_ids'", "1"]),
        ({"prompt": "x", "echo": True}, ["'echo'", "true"]),
        ({"prompt": "x", "stop": 5}, ["'stop'", "5"]),
        ({"prompt": "x", "stop": ["a", 1]}, ["'stop'", "list of strings"]),
        ({"prompt": "x", "stop": ["a", ""]}, ["'stop[1]'", "1..256"]),
        ({"prompt": "x", "stop": ["x" * 257]}, ["'stop[0]'", "257"]),
        ({"prompt": "x", "stop": ["a"] * 17}, ["'stop'", "17", "16"]),
        ({"prompt": "x", "stop": ["\ud800"]}, ["'stop[0]'", "lone surrogate"]),
        ({"prompt": "x", "best_of": 2}, ["'best_of'", "2"]),
        ({"prompt": "x", "presence_penalty": 0.5}, ["'presence_penalty'", "0.5"]),
        ({"prompt": "x", "min_tokens": 8}, ["'min_tokens'", "8"]),
        ({"prompt": "x", "prompt_logprobs": 1}, ["'prompt_logprobs'", "1"]),
        ({"prompt": "x", "use_beam_search": True}, ["'use_beam_search'", "true"]),
        ({"prompt": "x", "guided_json": {}}, ["'guided_json'"]),
        ({"prompt": "x", "skip_special_tokens": False}, ["'skip_special_tokens'", "false"]),
        ({"prompt": "x", "cache_salt": ""}, ["'cache_salt'", "1..256"]),
        ({"prompt": "x", "cache_salt": 7}, ["'cache_salt'", "7"]),
        ({"prompt": "x", "cache_salt": "s" * 257}, ["'cache_salt'", "1..256"]),
        ({"prompt": "x", "cache_salt": "\ud800"}, ["'cache_salt'", "lone surrogate"]),
    ],
)
def test_bad_input_is_a_400_naming_the_field(body, names):
    with pytest.raises(ApiError) as info:
        parse(body)
    assert (info.value.status, info.value.type) == (400, "invalid_request_error")
    for name in names:
        assert name in info.value.message, (name, info.value.message)


def test_a_null_cache_salt_is_none():
    assert parse({"prompt": "x", "cache_salt": None}).cache_salt is None


def test_the_fast_id_check_takes_only_ints_in_the_vocabulary():
    assert all_in_vocab([0, 5, VOCAB - 1], VOCAB)
    for ids in ([], [1, True], [1, 2.0], [1, None], [1, "2"], [-1, 3], [3, VOCAB], [[1]]):
        assert not all_in_vocab(ids, VOCAB), ids


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


def test_decode_delta_does_not_hold_back_invalid_bytes():
    assert _stream_text(BYTES, [0x80, 0x41, 0xFF, 0xE4, 0x41]) == [
        "\ufffd", "A", "\ufffd", "", "\ufffdA"]


# Bytes that start, continue, complete, break or cannot be in UTF-8, and an id past 255.
_AWKWARD_IDS = [0x41, 0x80, 0xBF, 0xC2, 0xE0, 0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0xFF, 300]


def test_decode_delta_concatenates_to_decode_for_any_ids(tmp_path):
    """Sequences past the HF tokenizer's DELTA_CONTEXT, so its windows start inside
    characters, after runs of incomplete bytes longer than the window, and on text."""
    rng = random.Random(0)
    tokenizers_ = [BYTES, HFTokenizer(_byte_level_tokenizer(tmp_path), VOCAB)]
    for _ in range(500):
        ids = [rng.choice(_AWKWARD_IDS) for _ in range(rng.randint(1, 40))]
        for tokenizer in tokenizers_:
            ids = [i % 256 for i in ids] if tokenizer is not BYTES else ids
            assert "".join(_stream_text(tokenizer, ids)) == tokenizer.decode(ids), ids


def test_decode_delta_of_a_metaspace_tokenizer_concatenates_to_decode(tmp_path):
    """A sentencepiece-style tokenizer drops a window's leading space when it decodes it alone;
    both windows of a delta start alike, so the stream keeps its spaces."""
    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(["abc def ghi jab cde fgh " * 50], trainers.BpeTrainer(
        vocab_size=64, special_tokens=["<unk>"], initial_alphabet=list("abcdefghij")))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    metaspace = HFTokenizer(str(tmp_path / "tokenizer.json"), VOCAB)
    rng = random.Random(1)
    for _ in range(200):
        text = " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 6)))
                        for _ in range(rng.randint(1, 15)))
        ids = metaspace.encode(text)
        assert "".join(_stream_text(metaspace, ids)) == metaspace.decode(ids) == text


class _CountingTokenizer(HFTokenizer):
    """Records how many ids each decode call was given."""

    def __init__(self, path: str) -> None:
        super().__init__(path, VOCAB)
        self.decoded: list[int] = []

    def decode(self, ids: list[int]) -> str:
        self.decoded.append(len(ids))
        return super().decode(ids)


def test_decode_delta_decodes_a_window_not_the_whole_stream(tmp_path):
    tokenizer = _CountingTokenizer(_byte_level_tokenizer(tmp_path))
    ids = tokenizer.encode("streamed text, one token at a time: 中文 🙂 " * 20)
    assert "".join(_stream_text(tokenizer, ids)) == tokenizer.decode(ids)
    # two decodes a token, each of at most the context and the new id
    assert max(tokenizer.decoded[:-1]) <= DELTA_CONTEXT + 1 < len(ids)


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

@contextlib.asynccontextmanager
async def api(api_key: str | None = None) -> AsyncIterator[tuple[TestClient, None]]:
    """An API server on a real EngineClient whose core never connects (so never ready): the
    routes' answers before the engine is up. Served routes are tested end to end in
    test_server.py."""
    with tempfile.TemporaryDirectory(prefix="rapi") as directory:
        addrs = (f"ipc://{directory}/requests", f"ipc://{directory}/outputs")
        client = EngineClient(*addrs)
        client.start()
        http = TestClient(TestServer(create_app(client, BYTES, MODEL, api_key, EngineConfig())))
        await http.start_server()
        try:
            yield http, None
        finally:
            await http.close()
            await client.close()


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
            for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"},
                            {"Authorization": "Basic sekrit"}]:
                response = await http.get("/v1/models", headers=headers)
                assert response.status == 401
                assert (await response.json())["error"]["type"] == "authentication_error"
            for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme's case is free
                response = await http.get("/v1/models",
                                          headers={"Authorization": f"{scheme} sekrit"})
                assert response.status == 503
    run(body)


@pytest.mark.parametrize("temperature, greedy", [(1e-40, True), (0.0, True), (9.9e-6, True),
                                                 (1e-5, False), (0.7, False)])
def test_a_temperature_too_small_to_divide_by_samples_greedily(temperature, greedy):
    """Logits divided by 1e-40 overflow float32 and the draw meets NaNs: under 1e-5 (vLLM's
    rule) a request is greedy instead."""
    params = parse({"prompt": "hi", "temperature": temperature}).params
    assert (params.temperature == 0.0) == greedy


def test_stream_events_encode_to_the_json_the_stdlib_reads():
    """jsonenc.dumps (orjson where installed) writes what json.loads reads back unchanged,
    non-ASCII text and -9999.0 logprobs included."""
    import json

    from resident.server import jsonenc

    event = {"id": "cmpl-1", "choices": [{"index": 0, "text": "é 日本\n\"", "token_ids": [7],
                                          "finish_reason": None,
                                          "logprobs": {"token_logprobs": [-9999.0, -0.5]}}]}
    encoded = jsonenc.dumps(event)
    assert isinstance(encoded, bytes) and json.loads(encoded) == event


def test_auto_api_processes_follow_the_load_and_the_cpus():
    from resident.server.api_processes import auto_api_processes

    assert auto_api_processes(2, 256) == 1  # a 2-CPU host: one
    assert auto_api_processes(16, 256) == 2  # one per 128 sequences
    assert auto_api_processes(64, 1024) == 4  # at most 4
    assert auto_api_processes(64, 1024, num_api_cpus=1) == 1  # api_core: one per API CPU
    assert auto_api_processes(64, 64) == 1
