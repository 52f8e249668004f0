"""The OpenAI answer shapes of the two endpoints, built from choices and their pieces
(choices.py). api.py wraps them in the envelope (`id`, `object`, `created`, `model`, `choices`)
and writes them, as one JSON body or as SSE events.

- Text completions (`text_completion`, streamed and not): a choice is `text`, `token_ids`,
  `finish_reason`, and `logprobs` in the completions shape (`completion_logprobs`). A stream
  sends one event per generated token; the last carries `finish_reason`.
- Chat completions (`chat.completion`; streamed as `chat.completion.chunk`): a choice is
  `message: {role: assistant, content}`; a stream opens each choice with a chunk holding the
  role, then sends `delta.content` chunks (one per token that adds text, or carries logprobs),
  then one chunk with an empty delta and `finish_reason`. `logprobs` in the chat shape
  (`{"content": [{token, logprob, bytes, top_logprobs}]}`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from resident.engine.types import TokenLogprobs
from resident.server.choices import Choice, Piece
from resident.server.tokenizer import Tokenizer

LOGPROB_FLOOR = -9999.0  # what -inf becomes in JSON (OpenAI's and vLLM's value)


class _Tokens:
    """How logprobs name tokens: their text, or `token_id:<id>` (return_tokens_as_token_ids)."""

    def __init__(self, tokenizer: Tokenizer, logprobs: bool, tokens_as_ids: bool) -> None:
        self.tokenizer = tokenizer
        self.logprobs = logprobs  # whether the request asked for logprobs
        self.tokens_as_ids = tokens_as_ids

    def name(self, token: int) -> str:
        return token_name(token, self.tokenizer, self.tokens_as_ids)


def token_name(token: int, tokenizer: Tokenizer, tokens_as_ids: bool) -> str:
    """A token as logprobs name it: its text alone, or `token_id:<id>`."""
    return f"token_id:{token}" if tokens_as_ids else tokenizer.decode([token])


class TextFormat(_Tokens):
    """/v1/completions."""

    object = "text_completion"
    chunk_object = "text_completion"
    id_prefix = "cmpl"

    def choice(self, choice: Choice) -> dict[str, Any]:
        return {"index": choice.index, "text": choice.text(), "token_ids": choice.token_ids,
                "finish_reason": choice.final.finish_reason,
                "logprobs": self._logprobs(choice.token_ids, choice.logprobs, 0)}

    def opening(self, choices: Sequence[Choice]) -> list[dict[str, Any]]:
        return []

    def chunks(self, piece: Piece) -> list[dict[str, Any]]:
        return [{"index": piece.index, "text": piece.text, "token_ids": piece.token_ids,
                 "finish_reason": piece.finish_reason,
                 "logprobs": self._logprobs(piece.token_ids, piece.logprobs, piece.text_offset)}]

    def _logprobs(self, tokens: list[int], logprobs: Sequence[TokenLogprobs],
                  first_offset: int) -> dict[str, list] | None:
        if not self.logprobs:
            return None
        return completion_logprobs(tokens, logprobs, self.tokenizer, first_offset,
                                   self.tokens_as_ids)


class ChatFormat(_Tokens):
    """/v1/chat/completions."""

    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def choice(self, choice: Choice) -> dict[str, Any]:
        return {"index": choice.index,
                "message": {"role": "assistant", "content": choice.text()},
                "finish_reason": choice.final.finish_reason,
                "logprobs": self._logprobs(choice.token_ids, choice.logprobs)}

    def opening(self, choices: Sequence[Choice]) -> list[dict[str, Any]]:
        return [{"index": choice.index, "delta": {"role": "assistant", "content": ""},
                 "logprobs": None, "finish_reason": None} for choice in choices]

    def chunks(self, piece: Piece) -> list[dict[str, Any]]:
        chunks = []
        if piece.text or (self.logprobs and piece.token_ids):
            chunks.append({"index": piece.index, "delta": {"content": piece.text},
                           "logprobs": self._logprobs(piece.token_ids, piece.logprobs),
                           "finish_reason": None})
        if piece.finish_reason is not None:
            chunks.append({"index": piece.index, "delta": {}, "logprobs": None,
                           "finish_reason": piece.finish_reason})
        return chunks

    def _logprobs(self, tokens: list[int],
                  logprobs: Sequence[TokenLogprobs]) -> dict[str, list] | None:
        """OpenAI chat `logprobs`: per token its text, logprob, UTF-8 bytes and the top
        alternatives (as many as top_logprobs asked)."""
        if not self.logprobs:
            return None
        content = []
        for token, entry in zip(tokens, logprobs, strict=True):
            top = [self._entry(other, other_logprob) for other, other_logprob in entry.top]
            content.append({**self._entry(token, entry.logprob), "top_logprobs": top})
        return {"content": content}

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        name = self.name(token)
        return {"token": name, "logprob": max(logprob, LOGPROB_FLOOR),
                "bytes": list(name.encode("utf-8"))}


def completion_logprobs(tokens: list[int], logprobs: Sequence[TokenLogprobs],
                        tokenizer: Tokenizer, first_offset: int,
                        tokens_as_ids: bool) -> dict[str, list]:
    """OpenAI completions `logprobs` of generated tokens: `tokens` (their text, or
    `token_id:<id>`), `token_logprobs`, `top_logprobs` (a mapping a token: the sampled token
    first, then the top k, as vLLM gives up to k + 1 entries) and `text_offset` (each token's
    offset in the completion's text, the first at `first_offset`)."""
    def name(token: int) -> str:
        return token_name(token, tokenizer, tokens_as_ids)

    body: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                             "text_offset": []}
    offset = first_offset
    for token, entry in zip(tokens, logprobs, strict=True):
        logprob = max(entry.logprob, LOGPROB_FLOOR)
        top = {name(token): logprob}
        for other, other_logprob in entry.top:
            top.setdefault(name(other), max(other_logprob, LOGPROB_FLOOR))
        body["tokens"].append(name(token))
        body["token_logprobs"].append(logprob)
        body["top_logprobs"].append(top)
        body["text_offset"].append(offset)
        offset += len(tokenizer.decode([token]))
    return body
