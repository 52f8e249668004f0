"""A streamed token's event from its template (server/token_event.py) against the general path
(Choice.take, the format's chunks, the envelope): the same bytes and the same choice state, for
both endpoints' formats, whatever the tokens' bytes (split characters, quotes, control bytes,
ids outside the bytes), and the outputs the template must not take."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resident.engine.types import RequestOutput, TokenLogprobs, is_plain
from resident.server.api import _Completion
from resident.server.chat import parse_chat_request
from resident.server.chat_template import load_chat_template
from resident.server.jsonenc import dumps
from resident.server.token_event import TokenEvent
from resident.server.tokenizer import ByteTokenizer
from resident.server.validation import parse_completion_request

VOCAB = 512
BYTES = ByteTokenizer(VOCAB)
STATE = SimpleNamespace(tokenizer=BYTES, model_name="tiny",
                        chat_template=load_chat_template(None))


def _completion(chat: bool, **body) -> _Completion:
    body = {"model": "tiny", "max_tokens": 64, "stream": True, **body}
    if chat:
        parsed = parse_chat_request({"messages": [{"role": "user", "content": "Hi"}], **body},
                                    BYTES, STATE.chat_template, "tiny", VOCAB, 4096)
    else:
        parsed = parse_completion_request({"prompt": "Hi", **body}, BYTES, "tiny", VOCAB, 4096)
    return _Completion(STATE, parsed, chat, 0.0)


def _pair(chat: bool, **body) -> tuple[_Completion, _Completion]:
    """Two completions with one id: the first renders plain tokens from its template, the
    second through the general path."""
    fast, general = _completion(chat, **body), _completion(chat, **body)
    general.id, general._event_head, general._token_event = fast.id, fast._event_head, None
    assert fast._token_event is not None
    return fast, general


# bytes that split UTF-8 characters, quotes, backslashes and control bytes, and ids no byte is
TOKENS = st.lists(st.sampled_from([*b'a"\\\n\x00 ', *"é€😀".encode(), 0xFF, 300, 511]),
                  min_size=1, max_size=40)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@settings(max_examples=60, deadline=None)
@given(tokens=TOKENS, data=st.data())
def test_a_template_event_is_the_general_paths_bytes(chat, tokens, data):
    """Outputs of one token, as the engine gives them, or of several (stream_interval), and
    writes of one output or several (a stream that fell behind)."""
    fast, general = _pair(chat)
    outputs, start = [], 0
    while start < len(tokens):
        end = min(len(tokens), start + data.draw(st.integers(1, 4)))
        last = end == len(tokens)
        outputs.append(RequestOutput(fast.id, tokens[start:end], finished=last,
                                     finish_reason="length" if last else None))
        start = end
    while outputs:
        size = data.draw(st.integers(1, 3))
        batch, outputs = outputs[:size], outputs[size:]
        assert fast._events(fast.choices[0], batch) == general._events(general.choices[0], batch)
    made, expected = fast.choices[0], general.choices[0]
    assert (made.token_ids, made.texts, made.text_length, made.final) \
        == (expected.token_ids, expected.texts, expected.text_length, expected.final)
    assert made.text() == BYTES.decode(tokens)


def test_only_plain_outputs_take_the_token_path():
    """is_plain: tokens, not the last, no error or logprobs (a cached count is allowed);
    takes_tokens: a streamed choice without stop strings that is not done."""
    logprobs = (TokenLogprobs(-0.5, ()),)
    for output in (RequestOutput("a", [97], num_cached_tokens=64), RequestOutput("a", [97, 98])):
        assert is_plain(output), output
    for output in (RequestOutput("a", []),
                   RequestOutput("a", [97], finished=True, finish_reason="length"),
                   RequestOutput("a", [97], error="boom"), RequestOutput("a", [97], rejected=True),
                   RequestOutput("a", [97], logprobs=logprobs)):
        assert not is_plain(output), output
    assert not _completion(False, stop=["x"]).choices[0].takes_tokens
    assert not _completion(False, stream=False).choices[0].takes_tokens
    choice = _completion(False).choices[0]
    assert choice.takes_tokens and choice.take_token(97, 5) == "a"
    assert choice.num_cached_tokens == 5 and choice.token_ids == [97]
    choice.take(RequestOutput("a", [98], finished=True, finish_reason="length"))
    assert choice.done and not choice.takes_tokens


def test_requests_the_template_cannot_stand_for_have_none():
    assert _completion(False, logprobs=1)._token_event is None
    assert _completion(False, n=2)._token_event is None
    assert _completion(False, stream=False)._token_event is None


def _event(chunk) -> bytes:
    return b"data: " + dumps(chunk) + b"\n\n"


def test_a_chunk_that_reads_more_than_text_and_token_gets_no_template():
    def by_offset(piece):
        return [{"text": piece.text, "offset": piece.text_offset}]

    def twice(piece):
        return [{"text": piece.text}, {"token": piece.token_ids}]

    def token_twice(piece):
        return [{"text": piece.text, "a": piece.token_ids, "b": piece.token_ids}]

    for chunks in (by_offset, twice, token_twice):
        assert TokenEvent.of(chunks, _event, 0) is None

    def plain(piece):
        return [{"index": piece.index, "token": piece.token_ids, "text": piece.text}]

    template = TokenEvent.of(plain, _event, 3)  # the token before the text
    assert template.render('a"b', 42) == _event({"index": 3, "token": [42], "text": 'a"b'})
