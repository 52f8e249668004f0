"""The chat API's parts without a server: stop strings over text split anyhow, the chat
template's resolution order, its sandbox and context, and chat bodies into engine requests."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resident.engine.types import FINISH_STOP, EngineRequest, RequestOutput, SamplingParams
from resident.server.chat import parse_chat_request
from resident.server.chat_template import (
    FALLBACK_NAME,
    FALLBACK_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    load_chat_template,
)
from resident.server.choices import Choice
from resident.server.stop import StopStrings
from resident.server.tokenizer import ByteTokenizer, HFTokenizer
from resident.server.validation import ApiError

VOCAB = 512
BYTES = ByteTokenizer(VOCAB)
USER = [{"role": "user", "content": "Hi"}]

# -- stop strings -------------------------------------------------------------------------------


def _run_stops(pieces: list[str], stops: tuple[str, ...]) -> tuple[list[str], bool]:
    matcher = StopStrings(stops)
    emitted = []
    for i, piece in enumerate(pieces):
        text, found = matcher.feed(piece, final=i == len(pieces) - 1)
        emitted.append(text)
        if found:
            return emitted, True
    return emitted, False


@given(st.text("ab\n", max_size=30), st.lists(st.text("ab\n", min_size=1, max_size=4),
                                               min_size=1, max_size=3), st.data())
def test_stop_strings_cut_the_text_wherever_the_pieces_split_it(text, stops, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *cuts, len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    emitted, found = _run_stops(pieces, tuple(stops))
    # generation stops at the first character that completes a stop string
    ends = [e for e in range(len(text) + 1) if any(text[:e].endswith(s) for s in stops)]
    expected = text
    if ends:
        expected = text[:ends[0] - max(len(s) for s in stops if text[:ends[0]].endswith(s))]
    assert "".join(emitted) == expected and found == bool(ends)
    # nothing emitted early: each emission so far is a prefix of the cut text that no later
    # piece can turn into a stop string
    for n in range(1, len(emitted) + 1):
        assert expected.startswith("".join(emitted[:n]))


def test_held_back_text_comes_out_when_the_match_fails():
    matcher = StopStrings(("STOP",))
    assert matcher.feed("go ST", final=False) == ("go ", False)
    assert matcher.feed("O", final=False) == ("", False)
    assert matcher.feed("MP", final=False) == ("STOMP", False)
    assert matcher.feed(" ST", final=True) == (" ST", False)  # the end flushes what is held


# -- the template ---------------------------------------------------------------------------


def _config(directory, **fields) -> None:
    (directory / "tokenizer_config.json").write_text(json.dumps(fields))


def test_a_choice_ended_by_a_stop_string_takes_no_later_tokens():
    """Tokens of steps already under way when the stop string was found arrive after it, in
    the same batch or later: the choice keeps the text before the stop and adds nothing (it
    once added '<|502|' after '<|299|', the matcher having been reset by its match: a chat
    test caught it once, under load)."""
    choice = Choice(0, EngineRequest("r", [1], SamplingParams(max_tokens=8)), BYTES, ("><",), False)
    pieces = [piece for tokens in ([299], [286], [502], [446])
              for piece in choice.take(RequestOutput("r", tokens))]
    assert choice.text() == "<|299|" and choice.done
    assert [piece.finish_reason for piece in pieces] == [None, FINISH_STOP]
    assert choice.take(RequestOutput("r", [7], True, "length")) == []


def test_resolution_order_jinja_file_then_tokenizer_config_then_chatml(tmp_path):
    assert load_chat_template(None).source == FALLBACK_NAME
    assert load_chat_template(str(tmp_path)).source == FALLBACK_NAME
    assert (load_chat_template(None).render(USER)
            == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    _config(tmp_path, chat_template="config:{{ messages[0].content }}", bos_token="<s>")
    assert load_chat_template(str(tmp_path)).render(USER) == "config:Hi"
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}jinja:{{ messages[0].content }}")
    template = load_chat_template(str(tmp_path))
    assert template.source == str(tmp_path / "chat_template.jinja")
    assert template.render(USER) == "<s>jinja:Hi"


def test_named_templates_take_the_default(tmp_path):
    _config(tmp_path, chat_template=[{"name": "tool_use", "template": "tools"},
                                     {"name": "default", "template": "default"}])
    assert load_chat_template(str(tmp_path)).render(USER) == "default"
    _config(tmp_path, chat_template=[{"name": "tool_use", "template": "tools"}])
    with pytest.raises(ValueError, match="'default'"):
        load_chat_template(str(tmp_path))


def test_a_template_that_does_not_compile_is_named(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="chat_template.jinja does not compile: line 1"):
        load_chat_template(str(tmp_path))


def test_the_context_transformers_gives(tmp_path):
    template = ChatTemplate("test", "{{ messages | tojson }}|{{ add_generation_prompt }}|"
                            "{{ tools is defined }}|{% generation %}g{% endgeneration %}|"
                            "{% for m in messages %}{% break %}{% endfor %}{{ eos_token }}|"
                            "{{ enable_thinking }}", eos_token="</s>")
    rendered = template.render([{"role": "user", "content": "中<b>"}],
                               {"enable_thinking": False, "messages": "ignored"})
    assert rendered == '[{"role": "user", "content": "中<b>"}]|True|False|g|</s>|False'


@pytest.mark.parametrize("text, message", [
    ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    ("{{ ''.__class__.__mro__ }}", "SecurityError"),  # no way out of the sandbox
    ("{{ messages.append(1) }}", "SecurityError"),  # immutable: the context is not changed
    ("{% set ns = namespace(_x=1) %}", "SecurityError"),
    ("{{ messages[0].content + 1 }}", "TypeError"),
    ("{{ messages[5].content.x }}", "UndefinedError"),
])
def test_template_failures_are_chat_template_errors(text, message):
    with pytest.raises(ChatTemplateError, match=message):
        ChatTemplate("test", text).render(USER)


# -- chat bodies ------------------------------------------------------------------------------


def parse(body, template=None, tokenizer=BYTES):
    return parse_chat_request(body, tokenizer, template or load_chat_template(None), "tiny",
                              VOCAB, 64)


def test_a_chat_body_becomes_the_rendered_prompt_and_its_sampling():
    parsed = parse({"messages": USER, "max_completion_tokens": 5, "max_tokens": 9,
                    "temperature": 0.5, "seed": 3, "logprobs": True, "top_logprobs": 2,
                    "stop": "x", "n": 2, "stream": True, "cache_salt": "tenant-a"})
    assert bytes(parsed.prompt_ids).decode() == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert (parsed.params.max_tokens, parsed.params.temperature, parsed.params.seed,
            parsed.params.logprobs) == (5, 0.5, 3, 2)
    assert parsed.stop == ("x",) and parsed.n == 2 and parsed.stream
    assert parsed.cache_salt == "tenant-a"
    # without a limit a chat may fill max_model_len; logprobs alone bring no alternatives
    parsed = parse({"messages": USER, "logprobs": True})
    assert parsed.params.max_tokens == 64 - len(parsed.prompt_ids)
    assert parsed.params.logprobs == 0


def test_a_template_that_writes_special_tokens_is_not_given_them_twice(tmp_path):
    import tokenizers
    from tokenizers import models, processors

    tokenizer = tokenizers.Tokenizer(models.WordLevel({"<s>": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tokenizer.add_special_tokens(["<s>"])
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                             special_tokens=[("<s>", 0)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    hf = HFTokenizer(str(tmp_path / "tokenizer.json"), VOCAB)
    assert hf.encode("<s>") == [0, 0]  # a completion prompt gets the post-processor's BOS
    parsed = parse({"messages": USER, "max_tokens": 1}, ChatTemplate("bos", "{{ bos_token }}",
                                                                     bos_token="<s>"), hf)
    assert parsed.prompt_ids == [0]


def test_a_rendering_that_is_too_long_or_empty_is_a_400():
    with pytest.raises(ApiError, match="no room to generate"):
        parse({"messages": [{"role": "user", "content": "x" * 80}]})
    with pytest.raises(ApiError, match="encodes to no tokens"):
        parse({"messages": USER}, ChatTemplate("empty", ""))


# a template in the style of Qwen's: whitespace control, a namespace scanned backwards, string
# tests and methods, tojson, loop controls, a kwarg (enable_thinking)
QWEN_STYLE = """{%- set ns = namespace(last_user=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- if message.role == "user" %}
        {%- set ns.last_user = (messages|length - 1) - loop.index0 %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "assistant" and '</think>' in message.content %}
        {{- '<|im_start|>assistant\\n' + message.content.split('</think>')[-1].lstrip('\\n') }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content }}
    {%- endif %}
    {%- if loop.index0 == ns.last_user %}{{ {"last": true, "text": "中"} | tojson }}{% endif %}
    {{- '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and not enable_thinking %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""


@pytest.mark.parametrize("text", [QWEN_STYLE, FALLBACK_TEMPLATE], ids=["qwen-style", "chatml"])
@pytest.mark.parametrize("extra", [{}, {"enable_thinking": False}])
def test_rendering_equals_transformers(text, extra):
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "中文"},
                {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHi"},
                {"role": "user", "content": "again"}]
    theirs = render_jinja_template([messages], chat_template=text, add_generation_prompt=True,
                                   **extra)[0][0]
    assert ChatTemplate("test", text).render(messages, extra) == theirs
