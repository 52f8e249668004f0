"""A streamed token's SSE event from a template: the bytes the general path (a Piece, its
format's chunk dicts, the JSON, the envelope) gives for a token that only adds text, with the
text and the token id put into a template made once a completion from that same path.

Nearly every event of a stream is of this kind: one token, not the last, no logprobs. Through
the general path such an event costs about a dozen Python calls (Choice.take, _piece, the Piece,
the chunk dict, the JSON of the whole chunk, the envelope): on the project's VM ~3 µs of the API
process's CPU a token, which the template cuts to ~1 (results/2026-12-05-cpu-token-event).
tests/test_token_event.py holds the two paths' bytes equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from resident.server.choices import Piece
from resident.server.jsonenc import dumps

TEXT_MARK = "@@token-text@@"
TOKEN_MARK = 914_702_385_561  # an id no vocabulary has: its digits occur nowhere else

Chunks = Callable[[Piece], list[dict[str, Any]]]  # a format's chunks (responses.py)
Event = Callable[[dict[str, Any]], bytes]  # a chunk's SSE event bytes


class TokenEvent:
    """`render(text, token)`: the event bytes of a plain piece (one token, not the last, no
    logprobs) that adds `text`."""

    def __init__(self, head: bytes, middle: bytes, tail: bytes, token_first: bool,
                 skip_empty: bool) -> None:
        # the event is head + first slot + middle + second slot + tail, the slots the text's
        # JSON and the token's digits in the order the chunk has them (no token slot: middle
        # and the second slot are empty)
        self._head, self._middle, self._tail = head, middle, tail
        self._token_first = token_first
        self._skip_empty = skip_empty  # a piece that adds no text has no event (chat)

    @classmethod
    def of(cls, chunks: Chunks, event: Event, index: int) -> TokenEvent | None:
        """Choice `index`'s template under a format's `chunks` and the completion's `event`;
        None where a plain piece is not one chunk that holds its text once and its token id at
        most once, or its event depends on more than those (the template cannot stand for
        it)."""
        marked = _events(chunks, event, index, TEXT_MARK)
        text_mark, token_mark = dumps(TEXT_MARK), b"%d" % TOKEN_MARK
        if marked is None or marked.count(text_mark) != 1 or marked.count(token_mark) > 1 \
                or marked != _events(chunks, event, index, TEXT_MARK, text_offset=7):
            return None
        before, after = marked.split(text_mark)
        if token_mark in before:
            head, middle = before.split(token_mark)
            template = cls(head, middle, after, True, False)
        elif token_mark in after:
            middle, tail = after.split(token_mark)
            template = cls(before, middle, tail, False, False)
        else:
            template = cls(before, b"", after, False, False)
        empty = _events(chunks, event, index, "")
        if empty == b"":
            template._skip_empty = True
        elif empty != template.render("", TOKEN_MARK):
            return None
        return template

    def render(self, text: str, token: int) -> bytes:
        if self._skip_empty and not text:
            return b""
        if self._token_first:
            return b"%b%d%b%b%b" % (self._head, token, self._middle, dumps(text), self._tail)
        if self._middle:
            return b"%b%b%b%d%b" % (self._head, dumps(text), self._middle, token, self._tail)
        return self._head + dumps(text) + self._tail


def _events(chunks: Chunks, event: Event, index: int, text: str,
            text_offset: int = 0) -> bytes | None:
    """The events of a plain piece adding `text` with the marked token; None where they are
    more than one chunk."""
    made = chunks(Piece(index, [TOKEN_MARK], (), text, text_offset, None, None))
    return None if len(made) > 1 else b"".join(event(chunk) for chunk in made)
