"""`resident serve --model tiny --device cpu` end to end: a real API process and engine core.

Exactness checks run the server in float64 and compare with the model run directly in process.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
import torch

from resident.model.config import load_model_config
from resident.model.weights import load_model
from resident.provenance import source_digest

from model_driver import greedy_alone
from server_fixture import ROOT, Server, get, idle_metrics, metrics, post, run, stream

TINY = load_model_config("tiny")
API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server():
    srv = Server("--set", "dtype=float64").wait_ready()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def pressured():
    """8 requests of up to 100 tokens need 8 * 7 pages; 24 pages force offloads. The prefix
    cache is on, with the tail snapshot (a repeated prompt restores up to its last page): its
    idle pages give way to the pressure."""
    srv = Server("--set", "dtype=float64", "--set", "num_kv_pages=25", "--set", "prefix_cache=on",
                 "--set", "prefix_snapshot_tail=on",
                 env={"RESIDENT_API_KEY": API_KEY}).wait_ready(AUTH)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def model64():
    return load_model(TINY, "cpu", torch.float64)


def prompts(count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 50, (count,), generator=generator).tolist()
    return [torch.randint(0, TINY.vocab_size, (n,), generator=generator).tolist()
            for n in lengths]


def complete(url: str, prompt, max_tokens: int, headers=None, **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **extra}
    status, data = run(post(url + "/v1/completions", body, headers))
    assert status == 200, data
    return data


def test_greedy_completions_equal_the_model(server, model64):
    for prompt in prompts(4, seed=1):
        data = complete(server.url, prompt, 12)
        assert data["choices"][0]["token_ids"] == greedy_alone(model64, prompt, 12)
        assert data["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 12,
                                 "total_tokens": len(prompt) + 12,
                                 "prompt_tokens_details": {"cached_tokens": 0}}


def test_string_prompt_uses_the_byte_tokenizer(server):
    data = complete(server.url, "Hello", 3)
    assert data["usage"]["prompt_tokens"] == 5
    status, config = run(get(server.url + "/debug/config"))
    assert status == 200 and config["tokenizer"] == "bytes"


def test_chat_without_a_checkpoint_template_renders_chatml(server):
    """The fallback template (tests/test_chat.py has a checkpoint's): the engine sees ChatML's
    bytes, and answers as /v1/completions does for that string."""
    status, config = run(get(server.url + "/debug/config"))
    assert status == 200 and config["chat_template"] == "chatml (fallback)"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                "<|im_start|>assistant\n")
    status, chat = run(post(server.url + "/v1/chat/completions",
                            {"messages": messages, "max_tokens": 5, "ignore_eos": True}))
    assert status == 200, chat
    assert chat["usage"]["prompt_tokens"] == len(rendered.encode())
    plain = complete(server.url, rendered, 5)
    assert chat["choices"][0]["message"]["content"] == plain["choices"][0]["text"]


def test_sixteen_concurrent_streams_match_running_alone(server, model64):
    batch = [(p, 3 + 2 * i) for i, p in enumerate(prompts(16, seed=2))]

    async def all_streams():
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(
                stream(session, server.url, {"prompt": p, "max_tokens": n, "ignore_eos": True})
                for p, n in batch))

    for (prompt, max_tokens), events in zip(batch, run(all_streams()), strict=True):
        assert len(events) == max_tokens
        assert all(len(e["choices"][0]["token_ids"]) == 1 for e in events)
        tokens = [e["choices"][0]["token_ids"][0] for e in events]
        assert tokens == greedy_alone(model64, prompt, max_tokens)
        assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_kv_pressure_offloads_and_gives_everything_back(pressured, model64):
    before = run(metrics(pressured.url, AUTH))
    batch = [(p, 60) for p in prompts(8, seed=3)]

    async def all_requests():
        async with aiohttp.ClientSession(headers=AUTH) as session:
            return await asyncio.gather(*(
                stream(session, pressured.url, {"prompt": p, "max_tokens": n, "ignore_eos": True})
                for p, n in batch))

    for (prompt, max_tokens), events in zip(batch, run(all_requests()), strict=True):
        tokens = [e["choices"][0]["token_ids"][0] for e in events]
        assert tokens == greedy_alone(model64, prompt, max_tokens)
    after = run(metrics(pressured.url, AUTH))
    assert after["resident_offloads_total"] > before["resident_offloads_total"]
    assert after["resident_reloads_total"] == after["resident_offloads_total"]
    for gauge in ("resident_kv_pages_free", "resident_gdn_slots_free"):
        assert after[gauge] == before[gauge]
    assert after["resident_requests_running"] == 0


def test_disconnected_clients_leave_nothing_held(server):
    before = run(metrics(server.url))

    async def hang_up():
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(
                stream(session, server.url, {"prompt": p, "max_tokens": 200, "ignore_eos": True},
                       stop_after=3)
                for p in prompts(6, seed=4)))

    run(hang_up())
    after = run(idle_metrics(server.url))
    assert after["resident_aborts_total"] - before["resident_aborts_total"] == 6
    # each had its first token (timed) and no end (aborted requests are not timed to it)
    ttft, e2e = "resident_time_to_first_token_seconds", "resident_e2e_request_latency_seconds"
    assert after[f"{ttft}_count"] - before[f"{ttft}_count"] == 6
    assert after[f"{ttft}_sum"] > before[f"{ttft}_sum"]
    assert after[f"{e2e}_count"] == before[f"{e2e}_count"]
    assert after["resident_kv_pages_free"] == before["resident_kv_pages_free"]
    assert after["resident_gdn_slots_free"] == before["resident_gdn_slots_free"]


def test_a_requests_queue_time_counts_from_its_arrival_at_the_api(server):
    """The API stamps a request's arrival as its handler starts, before the body is read: a
    body that comes 0.3 s after its headers is in the request's queue time (the core's
    histograms time from the API's stamp, not from the core's intake)."""
    queue = "resident_request_queue_seconds"
    before = run(idle_metrics(server.url))  # an earlier test's request timed by now, not after
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        time.sleep(0.3)
        sock.sendall(body)
        assert sock.recv(1 << 16).startswith(b"HTTP/1.1 200")
    after = run(idle_metrics(server.url))
    assert after[f"{queue}_count"] - before[f"{queue}_count"] == 1
    assert after[f"{queue}_sum"] - before[f"{queue}_sum"] >= 0.3



def test_the_engine_cores_garbage_collections_are_in_metrics(server):
    """The core records its collector's collections and pauses by generation for its life
    (heap.GcPauses; without the record the stats hold no samples): each generation labelled,
    none negative, a pause only where a collection ran (test_heap.py counts them in process)."""
    for prompt in prompts(4, seed=21):
        complete(server.url, prompt, 8)
    samples = run(idle_metrics(server.url))
    collections = [samples[f'resident_gc_collections_total{{kind="{g}"}}'] for g in "012"]
    pauses = [samples[f'resident_gc_pause_seconds_total{{kind="{g}"}}'] for g in "012"]
    assert all(n >= 0 and n == int(n) for n in collections), collections
    assert all(p >= 0 and (p > 0) <= (n > 0) for p, n in zip(pauses, collections, strict=True))

BAD_BODIES = [
    ("{not json", "JSON"),
    ("[1, 2]", "object"),
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": "", "max_tokens": 4}, "prompt"),
    ({"prompt": [], "max_tokens": 4}, "prompt"),
    ({"prompt": [1, "x"], "max_tokens": 4}, "prompt"),
    ({"prompt": [1, 512], "max_tokens": 4}, "prompt"),
    ({"prompt": [1, -1], "max_tokens": 4}, "prompt"),
    ({"prompt": [1, 2], "max_tokens": 5000}, "max_model_len"),
    ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": "4"}, "max_tokens"),
    ({"prompt": [1, 2], "temperature": -0.5}, "temperature"),
    ({"prompt": [1, 2], "top_p": 0}, "top_p"),
    ({"prompt": [1, 2], "top_p": 1.5}, "top_p"),
    ({"prompt": [1, 2], "top_k": "many"}, "top_k"),
    ({"prompt": [1, 2], "stream": "yes"}, "stream"),
    ({"prompt": [1, 2], "seed": "abc"}, "seed"),
    ({"prompt": [1, 2], "stop_token_ids": [9999]}, "stop_token_ids"),
]


@pytest.mark.parametrize("body, names", BAD_BODIES, ids=[str(i) for i in range(len(BAD_BODIES))])
def test_bad_input_gets_400_and_the_server_carries_on(server, body, names):
    status, data = run(post(server.url + "/v1/completions", body))
    assert status == 400, data
    assert data["error"]["type"] == "invalid_request_error"
    assert names in data["error"]["message"]
    assert complete(server.url, [1, 2, 3], 2)["usage"]["completion_tokens"] == 2


# raw bodies the API's two JSON readers read apart (orjson refuses or reads otherwise): each
# answered as the stdlib's reading decides (api._parse)
RAW_BODIES = [
    (b'{"prompt":[1,2],"max_tokens":2,"top_k":100000000000000000000000000000}', 200, ""),
    (b'{"prompt":[1,123456789012345678901234567890],"max_tokens":2}', 400,
     "'prompt[1]' = 123456789012345678901234567890 is outside the vocabulary"),
    (b'{"prompt":"\\ud800 x","max_tokens":2}', 400, "lone surrogate"),
    (b'{"prompt":[1,2],"max_tokens":2,"temperature":NaN}', 400, "'temperature'"),
    (b'\xef\xbb\xbf{"prompt":[1,2],"max_tokens":2}', 200, ""),
    (b'{"prompt":[1,2],', 400, "not valid JSON"),
]


@pytest.mark.parametrize("raw, status, message", RAW_BODIES,
                         ids=[str(i) for i in range(len(RAW_BODIES))])
def test_a_body_means_what_the_stdlibs_json_reads(server, raw, status, message):
    got, data = run(post(server.url + "/v1/completions", raw,
                         {"Content-Type": "application/json"}))
    assert got == status, data
    if status == 200:
        assert data["usage"]["completion_tokens"] == 2
    else:
        assert message in data["error"]["message"], data


def test_unknown_model_is_404(server):
    status, data = run(post(server.url + "/v1/completions",
                            {"prompt": [1], "max_tokens": 1, "model": "gpt-5"}))
    assert status == 404 and "gpt-5" in data["error"]["message"]


def test_api_key(pressured):
    status, _ = run(post(pressured.url + "/v1/completions", {"prompt": [1], "max_tokens": 1}))
    assert status == 401
    wrong = {"Authorization": "Bearer nope"}
    assert run(post(pressured.url + "/v1/completions", {"prompt": [1]}, wrong))[0] == 401
    assert run(get(pressured.url + "/health"))[0] == 200
    assert complete(pressured.url, [1, 2], 2, AUTH)["usage"]["completion_tokens"] == 2


def test_seeded_sampling_is_reproducible_across_servers(server, pressured):
    body = {"temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 1234}
    prompt = prompts(1, seed=5)[0]
    first = complete(server.url, prompt, 16, **body)["choices"][0]["token_ids"]
    second = complete(pressured.url, prompt, 16, AUTH, **body)["choices"][0]["token_ids"]
    assert first == second
    other = complete(server.url, prompt, 16, **{**body, "seed": 99})["choices"][0]["token_ids"]
    assert other != first


def test_debug_config_and_models(server):
    status, config = run(get(server.url + "/debug/config"))
    assert status == 200
    assert config["model"] == "tiny" and config["device"] == "cpu"
    assert config["dtype"] == "float64" and config["planning_mode"] == "resident"
    # the GDN state's auto follows the model's float64 (the default resolves to float32)
    assert config["knobs_changed"] == {"dtype": "float64", "gdn_state_dtype": "float64"}
    assert config["resident_package_path"] == str(ROOT / "resident")
    assert config["source_digest"] == source_digest(ROOT / "resident")
    assert isinstance(config["git_dirty"], bool)  # the tests run from a checkout
    assert len(config["weights_fingerprint"]) == 16
    status, models = run(get(server.url + "/v1/models"))
    assert isinstance(models["data"][0].pop("created"), int)
    assert models["data"][0] == {"id": "tiny", "object": "model", "owned_by": "resident",
                                 "max_model_len": 4096, "vocab_size": 512}


def _serve_fails(*args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "resident", "serve", "tiny", "--device", "cpu", *args],
        env={"PYTHONPATH": str(ROOT), "COLUMNS": "300", **(env or {})},
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    return " ".join(result.stderr.split())


def test_unknown_or_bad_knobs_fail_at_start():
    assert "unknown knob 'page_sise'" in _serve_fails("--set", "page_sise=8")
    assert "knob decode_order: 'random' is not one of arrival, turns" in _serve_fails(
        "--set", "decode_order=random")
    assert "knob page_size: 'x' is not a valid int" in _serve_fails(
        env={"RESIDENT_PAGE_SIZE": "x"})


def test_a_request_that_can_never_fit_is_a_400_and_others_carry_on(pressured):
    body = {"prompt": list(range(1, 301)), "max_tokens": 200}  # 500 tokens > 24 pages of 16
    for stream_it in (False, True):
        status, data = run(post(pressured.url + "/v1/completions",
                                {**body, "stream": stream_it}, AUTH))
        assert status == 400, data
        assert "can never fit" in data["error"]["message"]
    assert complete(pressured.url, [1, 2], 2, AUTH)["usage"]["completion_tokens"] == 2


def test_stream_usage_event_then_done(server):
    async def one():
        async with aiohttp.ClientSession() as session:
            return await stream(session, server.url, {
                "prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True,
                "stream_options": {"include_usage": True}})

    events = run(one())
    assert [len(e["choices"]) for e in events] == [1, 1, 1, 1, 0]
    assert events[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4,
                                   "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}}


def test_an_http_1_0_stream_comes_unchunked_and_whole(server, model64):
    """HTTP/1.0 has no chunked encoding: the stream's events (written by the engine client's
    router, server/pushed.py) come bare, and the answer ends when the server closes."""
    prompt, max_tokens = [5, 6, 7], 6
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.split()[1] == b"200" and b"chunked" not in head.lower()
    events = [json.loads(line[6:]) for line in payload.split(b"\n") if line.startswith(b"data: {")]
    assert [e["choices"][0]["token_ids"][0] for e in events] == greedy_alone(model64, prompt,
                                                                             max_tokens)
    assert payload.endswith(b"data: [DONE]\n\n")


def test_a_repeated_prompt_hits_the_prefix_cache(pressured, model64):
    """The second time a 70-token prompt comes, its first 64 tokens (4 pages, the last page
    boundary before its last token: the tail snapshot) are restored: the same tokens, reported
    as cached."""
    prompt = torch.randint(0, TINY.vocab_size, (70,),
                           generator=torch.Generator().manual_seed(9)).tolist()
    before = run(metrics(pressured.url, AUTH))
    expected = greedy_alone(model64, prompt, 5)
    first = complete(pressured.url, prompt, 5, AUTH)

    async def again():
        async with aiohttp.ClientSession(headers=AUTH) as session:
            return await stream(session, pressured.url, {
                "prompt": prompt, "max_tokens": 5, "ignore_eos": True,
                "stream_options": {"include_usage": True}})

    events = run(again())
    assert first["choices"][0]["token_ids"] == expected
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert [e["choices"][0]["token_ids"][0] for e in events[:-1]] == expected
    assert events[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}
    after = run(metrics(pressured.url, AUTH))
    hits = "resident_prefix_cache_hits_total"
    assert after[hits] == before[hits] + 1
    assert (after["resident_prefix_cache_saved_tokens_total"]
            == before["resident_prefix_cache_saved_tokens_total"] + 64)
    assert after["resident_kv_pages_free"] == before["resident_kv_pages_free"]


def test_a_cache_salt_shares_cached_prefixes_only_within_its_salt(pressured, model64):
    """vLLM's `cache_salt`: the prompt just cached unsalted is not a hit under a salt; the
    salt's second request is (its own pages), and another salt's is not; the tokens are the
    same every time."""
    prompt = torch.randint(0, TINY.vocab_size, (70,),
                           generator=torch.Generator().manual_seed(10)).tolist()
    expected = greedy_alone(model64, prompt, 5)
    cached = []
    for salt in (None, None, "tenant-a", "tenant-a", "tenant-b"):
        answer = complete(pressured.url, prompt, 5, AUTH, cache_salt=salt)
        assert answer["choices"][0]["token_ids"] == expected, salt
        cached.append(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert cached == [0, 64, 0, 64, 0]
