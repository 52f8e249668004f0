"""Text <-> token ids for the API process.

A checkpoint directory with a `tokenizer.json` gets a Hugging Face `tokenizers` tokenizer.
Anything else (the random-weight configs, which ship no tokenizer) gets the byte fallback:
token id b is the byte b, so any text round-trips through ids 0-255, and the ids a random model
samples above 255 are shown as `<|id|>`.

Streaming decodes incrementally with `decode_delta`, which is stateless: the caller passes every
generated id so far and how many of them it has already turned into text; each call decodes
only the new ids and a few before them.
"""

from __future__ import annotations

import codecs
import logging
import os
from typing import Protocol

import tokenizers

log = logging.getLogger("resident.api")

_REPLACEMENT = "\ufffd"  # what an incomplete UTF-8 sequence decodes to
# ids decoded before a stream's new ones: more than a character's bytes (4) or a word's pieces
DELTA_CONTEXT = 8


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`text`'s ids; `add_special_tokens=False` leaves out what the tokenizer's
        post-processor adds (a BOS), for text that already holds them (a chat template's)."""
        ...

    def decode(self, ids: list[int]) -> str: ...

    def decode_delta(self, all_ids: list[int], num_previous: int, final: bool = False) -> str: ...


def load_tokenizer(model_dir: str | None, vocab_size: int) -> Tokenizer:
    """The checkpoint's `tokenizer.json` when `model_dir` has one, else the byte fallback."""
    if model_dir and os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
        return HFTokenizer(os.path.join(model_dir, "tokenizer.json"), vocab_size)
    if model_dir and os.path.isdir(model_dir):
        log.warning("%s has no tokenizer.json; using the byte tokenizer", model_dir)
    return ByteTokenizer(vocab_size)


def _stable_text(text: str, final: bool) -> str:
    """The part of a decoded prefix that later tokens cannot change: while more tokens may come,
    a trailing replacement character may be the start of a character they complete."""
    return text if final else text.rstrip(_REPLACEMENT)


class ByteTokenizer:
    """Byte-level fallback for random-weight models that ship no tokenizer: encode gives the
    UTF-8 bytes of the text (byte b is token id b); decode turns runs of ids below 256 back into
    text (invalid UTF-8 becomes U+FFFD) and shows any other id as `<|id|>`."""

    name = "bytes"

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 256:
            raise ValueError(f"the byte tokenizer needs vocab_size >= 256, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        if len(ids) == 1 and not 0 <= ids[0] < 256:  # a streamed token of a random model
            return f"<|{ids[0]}|>"
        if all(0 <= token < 256 for token in ids):
            return bytes(ids).decode("utf-8", errors="replace")
        parts: list[str] = []
        run = bytearray()
        for token in ids:
            if 0 <= token < 256:
                run.append(token)
                continue
            parts.append(run.decode("utf-8", errors="replace"))
            run.clear()
            parts.append(f"<|{token}|>")
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)

    def decode_delta(self, all_ids: list[int], num_previous: int, final: bool = False) -> str:
        """The text that `all_ids[num_previous:]` adds. Until `final`, the bytes of a character
        still incomplete are held back and come with a later delta. Costs O(new ids)."""
        start = _settled(all_ids, num_previous)
        end = len(all_ids) if final else _settled(all_ids, len(all_ids))
        return self.decode(all_ids[start:end])


def _settled(ids: list[int], end: int) -> int:
    """How many of ids[:end] decode to text that later ids cannot change: all but a trailing
    incomplete UTF-8 character (at most 3 bytes). Byte text decodes the same split there."""
    if end == 0 or not 0 <= ids[end - 1] < 256:  # nothing can complete a non-byte id
        return end
    begin = end
    while begin > max(0, end - 3) and 0 <= ids[begin - 1] < 256:
        begin -= 1
    _, consumed = codecs.utf_8_decode(bytes(ids[begin:end]), "replace", False)
    return begin + consumed


class HFTokenizer:
    """A Hugging Face `tokenizer.json`. Decoding skips special tokens, as OpenAI servers do."""

    def __init__(self, path: str, vocab_size: int) -> None:
        self.name = path
        self._tokenizer = tokenizers.Tokenizer.from_file(path)
        size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        if size > vocab_size:
            # Prompts are still checked id by id, so this only matters if such ids show up.
            log.warning("%s has %d tokens but the model's vocab_size is %d", path, size, vocab_size)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def decode_delta(self, all_ids: list[int], num_previous: int, final: bool = False) -> str:
        """The text that `all_ids[num_previous:]` adds. Until `final`, a trailing U+FFFD (maybe
        a character still incomplete) is held back and comes with a later delta.

        Costs O(new ids + DELTA_CONTEXT), not O(all ids): it decodes the new ids with the
        DELTA_CONTEXT ids before them, twice from the same start (without and with the new
        ids), as vLLM's incremental detokenizer does, since a tokenizer need not decode a
        suffix the same on its own (a leading space dropped, a character split) but decodes
        both windows' common start alike. The emitted text is the stable part of the previous
        window, so the deltas concatenate to decode(all_ids). A window whose text is all held
        back (a run of incomplete bytes or skipped tokens longer than the context) falls back
        to decoding from the first id."""
        start = max(0, num_previous - DELTA_CONTEXT)
        previous = _stable_text(self.decode(all_ids[start:num_previous]), final=False)
        if start and not previous:
            start, previous = 0, _stable_text(self.decode(all_ids[:num_previous]), final=False)
        return _stable_text(self.decode(all_ids[start:]), final)[len(previous):]
