"""/v1/chat/completions and /v1/models through the `openai` client, on a real `resident serve`
of a tiny checkpoint directory whose tokenizer_config.json carries a chat template (and no
tokenizer.json: the byte tokenizer, so a prompt's tokens are its UTF-8 bytes). The ChatML
fallback is tested on the shipped tiny config in test_server.py.

What the engine saw is checked against the template's rendering written out by hand: the
prompt's token count, and the greedy text, which must equal /v1/completions' for that string.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import openai
import pytest

from model_driver import save_tiny_checkpoint
from server_fixture import (
    ROOT,
    Server,
    free_port,
    get,
    idle_metrics,
    metrics,
    post,
    run,
    sse_events,
    stop_across_tokens,
)

TEMPLATE = ("{{ bos_token }}{% for m in messages %}"
            "{% if m.role == 'tool' and loop.first %}"
            "{{ raise_exception('a conversation cannot open with a tool message') }}{% endif %}"
            "<{{ m.role }}>{{ m.content }}{{ eos_token }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                         {"type": "text", "text": "there"}]}]
RENDERED = "<s><system>Be brief.</s>\n<user>Hi\nthere</s>\n<assistant>"
GREEDY = {"ignore_eos": True}  # temperature defaults to 0 here


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("chat_ckpt")
    save_tiny_checkpoint(directory)
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": TEMPLATE, "bos_token": "<s>",
        "eos_token": {"content": "</s>", "special": True}}))
    srv = Server("--set", "dtype=float64", model=str(directory)).wait_ready()
    srv.model, srv.directory = directory.name, directory
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def completion_events(server, body: dict) -> list[dict]:
    """/v1/completions of `body`, streamed: one event per token."""
    async def go():
        async with aiohttp.ClientSession() as session:
            return await sse_events(session, server.url + "/v1/completions",
                                    {**body, "stream": True})
    return run(go())


def test_models_lists_the_served_model(client, server):
    models = client.models.list().data
    assert [(m.id, m.object, m.owned_by) for m in models] == [(server.model, "model", "resident")]
    assert isinstance(models[0].created, int)


def test_the_checkpoint_template_renders_what_the_engine_sees(client, server):
    chat = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=8,
                                          extra_body=GREEDY)
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")
    assert chat.usage.prompt_tokens == len(RENDERED.encode())
    assert chat.usage.completion_tokens == 8
    (choice,) = chat.choices
    assert (choice.index, choice.message.role, choice.finish_reason) == (0, "assistant", "length")
    status, plain = run(post(server.url + "/v1/completions",
                             {"prompt": RENDERED, "max_tokens": 8, **GREEDY}))
    assert status == 200
    assert choice.message.content == plain["choices"][0]["text"] != ""
    status, config = run(get(server.url + "/debug/config"))
    assert config["chat_template"].endswith(f"{server.model}/tokenizer_config.json")


def test_streaming_sends_the_role_then_content_then_the_finish_and_usage(client, server):
    whole = client.chat.completions.create(messages=MESSAGES, model=server.model, max_tokens=10,
                                           extra_body=GREEDY)
    chunks = list(client.chat.completions.create(
        messages=MESSAGES, model=server.model, max_completion_tokens=10, stream=True,
        stream_options={"include_usage": True}, extra_body=GREEDY))
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    first, *middle, finish, usage = chunks
    assert first.choices[0].delta.role == "assistant" and not first.choices[0].delta.content
    assert all(c.choices[0].finish_reason is None and c.choices[0].delta.content
               for c in middle)
    assert finish.choices[0].finish_reason == "length" and finish.choices[0].delta.content is None
    assert "".join(c.choices[0].delta.content for c in middle) == whole.choices[0].message.content
    assert usage.choices == [] and usage.usage == whole.usage


def test_n_greedy_choices_are_identical_streamed_or_not(client, server):
    one = client.chat.completions.create(messages=MESSAGES, model=server.model, max_tokens=6,
                                         extra_body=GREEDY)
    many = client.chat.completions.create(messages=MESSAGES, model=server.model, max_tokens=6,
                                          n=3, extra_body=GREEDY)
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert {c.message.content for c in many.choices} == {one.choices[0].message.content}
    assert many.usage.completion_tokens == 3 * 6
    assert many.usage.prompt_tokens == one.usage.prompt_tokens
    texts: dict[int, str] = {}
    finishes = {}
    chunks = list(client.chat.completions.create(messages=MESSAGES, model=server.model,
                                                 max_tokens=6, n=2, stream=True,
                                                 extra_body=GREEDY))
    # each choice opens with its own role chunk, one choice a chunk throughout
    assert [(c.choices[0].index, c.choices[0].delta.role) for c in chunks[:2]] == [
        (0, "assistant"), (1, "assistant")]
    assert all(len(c.choices) == 1 for c in chunks)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {0: one.choices[0].message.content, 1: one.choices[0].message.content}
    assert finishes == {0: "length", 1: "length"}


def test_seeded_choices_differ_and_each_reproduces_alone(client, server):
    """Choice i samples with seed + i (vLLM's rule)."""
    def sample(seed: int, n: int) -> list[str]:
        answer = client.chat.completions.create(messages=MESSAGES, model=server.model,
                                                max_tokens=8, n=n, temperature=1.0, seed=seed,
                                                extra_body=GREEDY)
        return [choice.message.content for choice in answer.choices]

    two = sample(5, 2)
    assert two[0] != two[1]
    assert two == sample(5, 1) + sample(6, 1)


def test_a_stop_string_split_across_tokens_ends_the_text_before_it(client, server):
    events = completion_events(server, {"prompt": RENDERED, "max_tokens": 24, **GREEDY})
    stop, before, num_tokens = stop_across_tokens([e["choices"][0]["text"] for e in events])
    chat = client.chat.completions.create(messages=MESSAGES, model=server.model, max_tokens=24,
                                          stop=[stop, "never seen"], extra_body=GREEDY)
    assert chat.choices[0].message.content == before
    assert chat.choices[0].finish_reason == "stop"
    assert chat.usage.completion_tokens == num_tokens  # the engine request was aborted there
    streamed = list(client.chat.completions.create(
        messages=MESSAGES, model=server.model, max_tokens=24, stop=stop, stream=True,
        extra_body=GREEDY))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == before
    assert streamed[-1].choices[0].finish_reason == "stop"
    # the same on /v1/completions, streamed: no event shows held-back text
    events = completion_events(server, {"prompt": RENDERED, "max_tokens": 24, "stop": stop,
                                        **GREEDY})
    assert "".join(e["choices"][0]["text"] for e in events) == before
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert sum(len(e["choices"][0]["token_ids"]) for e in events) == num_tokens


def test_chat_logprobs_match_the_completions_logprobs(client, server):
    chat = client.chat.completions.create(messages=MESSAGES, model=server.model, max_tokens=4,
                                          logprobs=True, top_logprobs=2, extra_body=GREEDY)
    status, plain = run(post(server.url + "/v1/completions",
                             {"prompt": RENDERED, "max_tokens": 4, "logprobs": 2, **GREEDY}))
    assert status == 200
    content = chat.choices[0].logprobs.content
    expected = plain["choices"][0]["logprobs"]
    assert [t.logprob for t in content] == expected["token_logprobs"]
    assert [t.token for t in content] == expected["tokens"]
    assert all(len(t.top_logprobs) == 2 and t.bytes == list(t.token.encode()) for t in content)


@pytest.mark.parametrize(
    "body, names",
    [
        ({}, ["'messages'", "required"]),
        ({"messages": "hi"}, ["'messages'", "list"]),
        ({"messages": []}, ["'messages'", "empty"]),
        ({"messages": ["hi"]}, ["'messages[0]'"]),
        ({"messages": [{"role": "robot", "content": "x"}]}, ["'messages[0].role'", "robot"]),
        ({"messages": [{"role": "user", "content": 5}]}, ["'messages[0].content'", "5"]),
        ({"messages": [{"role": "user"}]}, ["'messages[0].content'", "null"]),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         ["'messages[0].content[0]'", "text only"]),
        ({"messages": [{"role": "user", "content": "\ud800"}]},
         ["'messages[0].content'", "lone surrogate"]),
        ({"messages": [{"role": "tool", "content": "42"}]},
         ["chat template", "cannot open with a tool message"]),
        ({"messages": MESSAGES, "n": 17}, ["'n'", "17"]),
        ({"messages": MESSAGES, "stop": [1]}, ["'stop'"]),
        ({"messages": MESSAGES, "top_logprobs": 2}, ["'top_logprobs'", "'logprobs': true"]),
        ({"messages": MESSAGES, "max_completion_tokens": 0}, ["'max_tokens'", "0"]),
        ({"messages": MESSAGES, "tools": [{"type": "function"}]}, ["'tools'"]),
        ({"messages": MESSAGES, "min_tokens": 4}, ["'min_tokens'", "4"]),
        ({"messages": MESSAGES, "chat_template_kwargs": [1]}, ["'chat_template_kwargs'"]),
        ({"messages": MESSAGES, "max_tokens": 5000}, ["max_model_len"]),
    ],
)
def test_bad_chat_bodies_are_json_400s_naming_the_problem(server, body, names):
    status, data = run(post(server.url + "/v1/chat/completions", body))
    assert status == 400, data
    assert data["error"]["type"] == "invalid_request_error"
    for name in names:
        assert name in data["error"]["message"], data


def test_the_openai_client_sees_a_bad_request_and_the_server_carries_on(client, server):
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=server.model, messages=[], max_tokens=2)
    with pytest.raises(openai.NotFoundError, match="not served"):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
    ok = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=2)
    assert ok.usage.completion_tokens <= 2


def test_a_client_that_hangs_up_aborts_every_choice(server):
    before = run(metrics(server.url))

    async def hang_up():
        async with aiohttp.ClientSession() as session, session.post(
                server.url + "/v1/chat/completions",
                json={"messages": MESSAGES, "max_tokens": 400, "n": 2, "stream": True,
                      **GREEDY}) as resp:
            assert resp.status == 200
            async for raw in resp.content:
                if not raw.startswith(b"data: {"):
                    continue
                choices = json.loads(raw[len(b"data: "):])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    return  # leaving closes the connection mid-stream

    run(hang_up())
    after = run(idle_metrics(server.url))
    assert after["resident_aborts_total"] - before["resident_aborts_total"] == 2
    assert after["resident_kv_pages_free"] == before["resident_kv_pages_free"]


def test_the_api_process_never_loads_torch(client, server):
    client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=2)
    maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    assert "libtorch" not in maps
    assert "libtorch" in Path(f"/proc/{server.core_pid()}/maps").read_text()


def test_a_template_that_does_not_compile_stops_serve_at_start(server, tmp_path):
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).symlink_to(server.directory / name)
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}")
    result = subprocess.run(
        [sys.executable, "-m", "resident", "serve", str(tmp_path), "--device", "cpu",
         "--port", str(free_port())],
        env={"PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"{tmp_path}/chat_template.jinja does not compile" in result.stderr
    assert "Traceback" not in result.stderr
