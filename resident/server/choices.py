"""One choice of a completion: its engine request, the tokens it has produced, and its text.

The core's outputs become `Piece`s, one per generated token (or one closing piece with no
token), each with the text that token adds: detokenized incrementally (tokenizer.decode_delta)
and, with stop strings, cut before the first stop string (stop.py), so a piece never shows text
a stop string will remove. A choice that hit a stop string is `done` before its engine request
finished: the caller stops reading it, which aborts the request in the core. Both endpoints
(completions and chat) build their answers from pieces (responses.py).
"""

from __future__ import annotations

from typing import NamedTuple

from resident.engine.types import FINISH_STOP, EngineRequest, RequestOutput, TokenLogprobs
from resident.server.stop import StopStrings
from resident.server.tokenizer import Tokenizer


class Piece(NamedTuple):
    """What one generated token (or a closing output without one) adds to a choice."""

    index: int  # the choice's
    token_ids: list[int]  # the token, or none for a closing piece
    logprobs: tuple[TokenLogprobs, ...]  # its logprobs entry, when the request asked
    text: str  # the text it adds ("" while a character or a possible stop string is held)
    text_offset: int  # characters of the choice's text before this piece's
    finish_reason: str | None  # set on the choice's last piece
    error: str | None  # why the choice failed, on its last piece


class Choice:
    """The state of choice `index`, whose engine request is `request`.

    `incremental`: detokenize each token as it comes (streams, stop strings); otherwise the
    text is decoded once, at the end."""

    def __init__(self, index: int, request: EngineRequest, tokenizer: Tokenizer,
                 stops: tuple[str, ...], incremental: bool) -> None:
        self.index = index
        self.request = request
        self.tokenizer = tokenizer
        self.stop = StopStrings(stops) if stops else None
        self.incremental = incremental or self.stop is not None
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] = []
        self.texts: list[str] = []  # the pieces' texts (incremental only)
        self.text_length = 0
        self.num_cached_tokens = 0  # prompt tokens the prefix cache restored
        self.final: RequestOutput | None = None  # the output that finished it (stop: made here)

    @property
    def done(self) -> bool:
        return self.final is not None

    def take(self, output: RequestOutput) -> list[Piece]:
        """Records one output of the core; the pieces it adds. Once a stop string is found
        the choice is done and the output's later tokens are dropped, and so are later outputs:
        the abort of its engine request reaches the core after the steps already under way,
        whose tokens can arrive in the same batch as the stop's (the matcher, reset by the
        match, would emit their text after the cut)."""
        if self.done:
            return []
        logprobs = output.logprobs or ()
        self.num_cached_tokens = max(self.num_cached_tokens, output.num_cached_tokens)
        pieces = []
        for i, token in enumerate(output.new_token_ids):
            last = output.finished and i == len(output.new_token_ids) - 1
            pieces.append(self._piece([token], logprobs[i:i + 1], last, output))
            if self.done:
                break
        if output.finished and not output.new_token_ids and not self.done:
            pieces.append(self._piece([], (), True, output))
        return pieces

    @property
    def takes_tokens(self) -> bool:
        """Whether `take_token` serves: a streamed choice without stop strings, not done."""
        return self.stop is None and self.incremental and self.final is None

    def take_token(self, token: int, num_cached_tokens: int) -> str:
        """`take` of a token of a plain output (types.is_plain) where `takes_tokens`: the text
        it adds, without a Piece."""
        if num_cached_tokens > self.num_cached_tokens:
            self.num_cached_tokens = num_cached_tokens
        return self._add(self._decode([token], False))

    def _piece(self, tokens: list[int], logprobs: tuple[TokenLogprobs, ...], last: bool,
               output: RequestOutput) -> Piece:
        self.logprobs.extend(logprobs)
        text = self._decode(tokens, last)
        if last:
            self.final = output
        if self.stop is not None:
            text, found = self.stop.feed(text, final=last)
            if found:
                self.final = RequestOutput(output.request_id, [], True, FINISH_STOP)
        offset = self.text_length
        self._add(text)
        final = self.final
        return Piece(self.index, tokens, logprobs, text, offset,
                     final.finish_reason if final else None, final.error if final else None)

    def _decode(self, tokens: list[int], last: bool) -> str:
        """Appends `tokens`; the text they add (incremental; else "")."""
        previous = len(self.token_ids)
        self.token_ids.extend(tokens)
        if not self.incremental:
            return ""
        return self.tokenizer.decode_delta(self.token_ids, previous, final=last)

    def _add(self, text: str) -> str:
        self.text_length += len(text)
        if self.incremental:
            self.texts.append(text)
        return text

    def text(self) -> str:
        """The choice's whole text (once it is done)."""
        return "".join(self.texts) if self.incremental else self.tokenizer.decode(self.token_ids)
