"""The types the engine takes and gives: a request to add, its sampling parameters, and the
outputs each step emits. The server's wire protocol (server/protocol.py) wraps these; nothing
here knows about processes, pipes or HTTP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

FINISH_LENGTH = "length"  # max_tokens reached
FINISH_STOP = "stop"  # an EOS or stop token was sampled
FINISH_ABORT = "abort"  # the client went away
FINISH_ERROR = "error"  # this request failed alone (e.g. it can never fit the KV pool)

MAX_LOGPROBS = 20  # the most top logprobs a token may ask for (vLLM's default limit)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. temperature 0 is greedy; top_k 0, top_p 1 and min_p 0 are off
    (min_p drops tokens under min_p times the top token's probability). seed: the same seed
    over the same logits gives the same tokens, whatever else runs beside (None: the engine
    gives one). logprobs: None for none; k for each generated token's log-probability and the
    k most likely tokens' (from the model's raw logits, before temperature and the filters)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.temperature < float("inf"):
            raise ValueError(f"temperature must be >= 0 and finite, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be None or 0..{MAX_LOGPROBS}, got {self.logprobs}")


@dataclass(frozen=True)
class EngineRequest:
    """A completion to run: its id (unique among running requests), prompt and sampling."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # when the API process took the request in, on the host's monotonic clock (time.monotonic,
    # which the API processes and the engine core share); None: the engine stamps its intake
    arrived_s: float | None = None
    # vLLM's `cache_salt`: the prompt shares cached prefixes only with requests of the same
    # salt (one tenant's prompts never hit another's pages); None: with every unsalted request
    cache_salt: str | None = None


@dataclass(frozen=True)
class TokenLogprobs:
    """One generated token's log-probability and the most likely tokens' at its position, most
    likely first (as many as its request's `logprobs` asked; the token may be among them)."""

    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, log-probability)


class RequestOutput(NamedTuple):
    """New tokens of one request since its last output; the last one has `finished` set.
    `logprobs`, when the request asked for them, holds one entry per new token. A NamedTuple,
    not a dataclass: a step's outputs cross the pipe to the API pickled, and a tuple pickles
    and unpickles in about two thirds of a frozen dataclass's time with one object, not two,
    for the collector (results/2026-12-04-cpu-api-synthetic)."""

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    rejected: bool = False  # refused at intake (bad or never-fitting request): a client error
    num_cached_tokens: int = 0  # prompt tokens a prefix cache hit restored (not computed)
    logprobs: tuple[TokenLogprobs, ...] | None = None

    def __reduce__(self):
        # unpickled by tuple.__new__ (C), not the class's generated Python __new__: 0.36 against
        # 0.46 µs a row unpickling a step's 64 outputs
        return tuple.__new__, (RequestOutput, tuple(self))


_PLAIN_FIELDS = (False, None, None, False)  # finished, finish_reason, error, rejected


def is_plain(output: RequestOutput) -> bool:
    """Tokens and nothing else (but the prompt's cached count): not the last, no error, no
    logprobs. A stream renders each of its tokens from a template (server/token_event.py)."""
    return bool(output.new_token_ids) and output[2:6] == _PLAIN_FIELDS \
        and output.logprobs is None


def plain_output(request_id: str, token: int, num_cached_tokens: int) -> RequestOutput:
    """The plain output of one token (`is_plain`) from its parts, as StepOutputs' columns
    carry it (server/protocol.py)."""
    return RequestOutput(request_id, [token], num_cached_tokens=num_cached_tokens)
