"""OpenAI `/v1/completions` request bodies, validated into what the engine takes.

Departures from OpenAI: `temperature` defaults to 0 (greedy), not 1, and under 1e-5 samples
greedily (as vLLM's); a null optional field means its default; fields we cannot honour (`echo`,
`best_of`, penalties, ...) are rejected unless they hold their neutral value; `n` is capped at
MAX_N. The fields both endpoints share (sampling, `stop`, `n`, streaming) are read by
`generation_request`; chat.py reads the chat body's own.
`logprobs` takes 0..20 as vLLM does (OpenAI stops at 5), and vLLM's `return_tokens_as_token_ids`
names the tokens `token_id:<id>`. Every refusal is an ApiError naming the field: the API answers
it as a 400 (or 404 for another model's name) with a JSON body.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from resident.engine.types import MAX_LOGPROBS, SamplingParams
from resident.server.tokenizer import Tokenizer

DEFAULT_MAX_TOKENS = 16
# a temperature under this samples greedily (vLLM's rule): dividing the logits by it overflows
# float32, and the sampler would draw from NaNs
GREEDY_BELOW = 1e-5
MAX_STOP_TOKEN_IDS = 256
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # a stop string's length: a stream holds back up to this many
MAX_CACHE_SALT_CHARS = 256
MAX_N = 16  # choices a request (each one engine request)


class ApiError(Exception):
    """An error answered as `{"error": {"message", "type", "request_id"}}` with an HTTP status
    (server/http.py), and `headers` (e.g. Retry-After)."""

    def __init__(self, status: int, type: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.headers = headers or {}


def bad_request(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


class CompletionRequest(NamedTuple):
    """A validated completion request."""

    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    return_tokens_as_token_ids: bool  # logprobs name tokens `token_id:<id>`, not their text
    stop: tuple[str, ...] = ()  # a choice's text ends before the first it produces
    n: int = 1  # choices, each its own engine request
    cache_salt: str | None = None  # EngineRequest.cache_salt


# Fields OpenAI clients send that we cannot honour: accepted only with one of these values.
PENALTIES: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
}
# vLLM's sampling extensions this engine does not implement (it does min_p, top_k, ignore_eos,
# stop_token_ids and return_tokens_as_token_ids): a client written for vLLM that sends one
# gets a 400 naming it, not an answer that silently ignored it.
VLLM_EXTENSIONS: dict[str, tuple[Any, ...]] = {
    "min_tokens": (None, 0),
    "prompt_logprobs": (None,),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "logits_processors": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
}
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    **PENALTIES,
    **VLLM_EXTENSIONS,
}


def show(value: Any) -> str:
    """A field's value for an error message, cut to 60 characters."""
    text = json.dumps(value) if _is_json(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def as_float(value: Any) -> float | None:
    """`value` as a finite float, or None if it is not a finite number (bools are not)."""
    if not (_is_int(value) or isinstance(value, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_neutral(body: dict[str, Any], neutral: dict[str, tuple[Any, ...]]) -> None:
    """400 for a field of `neutral` that holds none of its accepted values."""
    for name, accepted in neutral.items():
        value = body.get(name)
        if not any(_same(value, ok) for ok in accepted):
            allowed = " or ".join(json.dumps(ok) for ok in accepted)
            raise bad_request(f"'{name}' = {show(value)} is not supported (only {allowed})")


def _same(value: Any, neutral: Any) -> bool:
    # True == 1 and False == 0 in Python; a bool must match only a bool.
    return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral


def _field(body: dict[str, Any], name: str, default: Any, convert, expected: str) -> Any:
    """The field's value through `convert` (None when it does not fit), or its default when the
    field is absent or null."""
    value = body.get(name)
    if value is None:
        return default
    converted = convert(value)
    if converted is None:
        raise bad_request(f"'{name}' must be {expected}, got {show(value)}")
    return converted


def int_field(body: dict[str, Any], name: str, default: int) -> int:
    return _field(body, name, default, lambda v: v if _is_int(v) else None, "an integer")


def _number_field(body: dict[str, Any], name: str, default: float) -> float:
    return _field(body, name, default, as_float, "a finite number")


def bool_field(body: dict[str, Any], name: str, default: bool) -> bool:
    return _field(body, name, default, lambda v: v if isinstance(v, bool) else None,
                  "true or false")


def all_in_vocab(ids: list[Any], vocab_size: int) -> bool:
    """Whether `ids` is a non-empty list of ints (no bools) in [0, vocab_size): three passes in
    C, about a third of one Python loop's time (55 against 175 µs at 1,280 ids on the
    project's VM); a prompt's ids are what the API's intake of a request mostly costs."""
    return bool(ids) and set(map(type, ids)) == {int} and min(ids) >= 0 \
        and max(ids) < vocab_size


def token_ids_in_vocab(value: list[Any], name: str, vocab_size: int) -> list[int]:
    """`value`, if every item is a token id of the vocabulary; else a 400 naming the first
    item that is not."""
    if all_in_vocab(value, vocab_size):
        return value
    for i, token in enumerate(value):
        if not _is_int(token):
            raise bad_request(f"'{name}[{i}]' must be an integer token id, got {show(token)}")
        if not 0 <= token < vocab_size:
            raise bad_request(f"'{name}[{i}]' = {token} is outside the vocabulary "
                              f"[0, {vocab_size})")
    return value


def _prompt(body: dict[str, Any], tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("'prompt' is required")
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' must not be empty")
        return encode_text(prompt, "prompt", tokenizer, vocab_size)
    if not isinstance(prompt, list):
        raise bad_request(f"'prompt' must be a string or a list of token ids, got {show(prompt)}")
    if not prompt:
        raise bad_request("'prompt' must not be empty")
    if all_in_vocab(prompt, vocab_size):
        return prompt
    if any(isinstance(item, str) for item in prompt):
        raise bad_request("'prompt' as a list of strings (several prompts in one request) is "
                          "not supported: send one prompt a request")
    return token_ids_in_vocab(prompt, "prompt", vocab_size)


def encode_text(text: str, name: str, tokenizer: Tokenizer, vocab_size: int,
                add_special_tokens: bool = True) -> list[int]:
    """`text` (the field `name`) as token ids: valid Unicode, at least one token, all in the
    vocabulary."""
    check_unicode(text, name)
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    if not ids:
        raise bad_request(f"'{name}' = {show(text)} encodes to no tokens")
    outside = [t for t in ids if not 0 <= t < vocab_size]
    if outside:
        raise bad_request(f"'{name}' encodes to token {outside[0]}, outside [0, {vocab_size})")
    return ids


def check_unicode(text: str, name: str) -> None:
    """JSON can carry lone surrogates (`"\\ud800"`), which no UTF-8 tokenizer encodes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise bad_request(f"'{name}' is not valid Unicode text: a lone surrogate at index "
                          f"{error.start}") from None


def _sampling(body: dict[str, Any], vocab_size: int, max_tokens: int,
              logprobs: int | None) -> SamplingParams:
    temperature = _number_field(body, "temperature", 0.0)
    if temperature < 0:
        raise bad_request(f"'temperature' must be >= 0, got {show(body['temperature'])}")
    if temperature < GREEDY_BELOW:
        temperature = 0.0
    top_p = _number_field(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise bad_request(f"'top_p' must be in (0, 1], got {show(body['top_p'])}")
    min_p = _number_field(body, "min_p", 0.0)
    if not 0 <= min_p <= 1:
        raise bad_request(f"'min_p' must be in [0, 1], got {show(body['min_p'])}")
    top_k = int_field(body, "top_k", 0)
    if top_k < -1:
        raise bad_request(f"'top_k' must be >= 0 (or -1 for off), got {top_k}")
    seed = body.get("seed")
    if seed is not None and not (_is_int(seed) and -(2**63) <= seed < 2**64):
        raise bad_request(f"'seed' must be null or a 64-bit integer, got {show(seed)}")
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and not isinstance(stop_ids, list):
        raise bad_request(f"'stop_token_ids' must be a list of token ids, got {show(stop_ids)}")
    if stop_ids is not None and len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise bad_request(f"'stop_token_ids' holds {len(stop_ids)} ids; at most "
                          f"{MAX_STOP_TOKEN_IDS}")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        # -1 is off as in vLLM; k >= vocab_size keeps every token, which is off too.
        top_k=0 if top_k == -1 or top_k >= vocab_size else top_k,
        min_p=min_p,
        seed=seed,
        ignore_eos=bool_field(body, "ignore_eos", False),
        stop_token_ids=tuple(token_ids_in_vocab(stop_ids or [], "stop_token_ids", vocab_size)),
        logprobs=logprobs,
    )


def logprobs_count(body: dict[str, Any], name: str) -> int | None:
    """How many top logprobs each generated token brings, from the field `name` (None: no
    logprobs)."""
    value = body.get(name)
    if value is not None and not (_is_int(value) and 0 <= value <= MAX_LOGPROBS):
        raise bad_request(f"'{name}' must be null or an integer 0..{MAX_LOGPROBS}, got "
                          f"{show(value)}")
    return value


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad_request(f"'stream_options' must be an object, got {show(options)}")
    return bool_field(options, "include_usage", False)


def _cache_salt(body: dict[str, Any]) -> str | None:
    """`cache_salt` (vLLM's): null, or a string of 1..MAX_CACHE_SALT_CHARS characters."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not 0 < len(salt) <= MAX_CACHE_SALT_CHARS:
        raise bad_request(f"'cache_salt' must be a string of 1..{MAX_CACHE_SALT_CHARS} "
                          f"characters, got {show(salt)}")
    check_unicode(salt, "cache_salt")
    return salt


def _stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    """`stop`: null, a string or a list of strings ("" and [] mean none)."""
    stop = body.get("stop")
    if stop is None or stop == "":
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request(f"'stop' must be a string or a list of strings, got {show(stop)}")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"'stop' holds {len(stops)} strings; at most {MAX_STOP_STRINGS}")
    for i, text in enumerate(stops):
        if not 0 < len(text) <= MAX_STOP_CHARS:
            raise bad_request(f"'stop[{i}]' must be 1..{MAX_STOP_CHARS} characters, got "
                              f"{len(text)}")
        check_unicode(text, f"stop[{i}]")
    return tuple(dict.fromkeys(stops))


def _num_choices(body: dict[str, Any]) -> int:
    n = int_field(body, "n", 1)
    if not 1 <= n <= MAX_N:
        raise bad_request(f"'n' must be 1..{MAX_N}, got {n}")
    return n


def check_body(body: Any, model_name: str) -> dict[str, Any]:
    """The body as a JSON object naming this server's model (or none): 400 for a body that is
    not an object, 404 for another model's name."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {show(body)}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request(f"'model' must be a string, got {show(model)}")
    if model is not None and model != model_name:
        raise ApiError(404, "not_found_error", f"model {model!r} is not served here "
                       f"(this server serves {model_name!r})")
    return body


def generation_request(body: dict[str, Any], prompt_ids: list[int], max_tokens: int,
                       logprobs: int | None, vocab_size: int,
                       max_model_len: int) -> CompletionRequest:
    """What both endpoints share: sampling, `stop`, `n`, streaming, for a prompt of
    `prompt_ids` and `max_tokens` (the endpoint's own field, or its default)."""
    params = _sampling(body, vocab_size, max_tokens, logprobs)
    if params.max_tokens <= 0:
        raise bad_request(f"'max_tokens' must be > 0, got {params.max_tokens}")
    total = len(prompt_ids) + params.max_tokens
    if total > max_model_len:
        raise bad_request(f"the prompt's {len(prompt_ids)} tokens plus 'max_tokens' = "
                          f"{params.max_tokens} make {total}, over max_model_len {max_model_len}")
    return CompletionRequest(prompt_ids, params, bool_field(body, "stream", False),
                             _include_usage(body),
                             bool_field(body, "return_tokens_as_token_ids", False),
                             _stop_strings(body), _num_choices(body), _cache_salt(body))


def parse_completion_request(
    body: Any, tokenizer: Tokenizer, model_name: str, vocab_size: int, max_model_len: int
) -> CompletionRequest:
    """Validates a /v1/completions body.

    Raises ApiError: 404 for another model's name, 400 naming the field for anything else.
    Unknown fields are ignored; null means a field's default."""
    check_neutral(check_body(body, model_name), _NEUTRAL)
    prompt_ids = _prompt(body, tokenizer, vocab_size)
    return generation_request(body, prompt_ids, int_field(body, "max_tokens", DEFAULT_MAX_TOKENS),
                              logprobs_count(body, "logprobs"), vocab_size, max_model_len)
