"""Messages between the API process and the engine-core process.

Two ZMQ PUSH/PULL pipes over IPC carry pickled dataclasses: requests go API -> core, outputs and
replies go core -> API. Nothing here imports torch: the API process never touches torch state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FINISH_LENGTH = "length"  # max_tokens reached
FINISH_STOP = "stop"  # an EOS or stop token was sampled
FINISH_ABORT = "abort"  # the client went away
FINISH_ERROR = "error"  # this request failed alone (e.g. it can never fit the KV pool)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. temperature 0 is greedy; top_k 0 and top_p 1 are off."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()


# -- API -> core ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class StatsQuery:
    """Asks the core for its counters (for /metrics) and debug state, or (section) its phase
    timing, read or read then reset; answered by StatsReply."""

    nonce: int
    section: str = "stats"  # stats | phases | phases_reset


@dataclass(frozen=True)
class Shutdown:
    pass


# -- core -> API ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestOutput:
    """New tokens of one request since its last output; the last one has `finished` set."""

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    rejected: bool = False  # refused at intake (bad or never-fitting request): a client error


@dataclass(frozen=True)
class StepOutputs:
    outputs: list[RequestOutput]


@dataclass(frozen=True)
class StatsReply:
    nonce: int
    stats: dict[str, Any]


@dataclass(frozen=True)
class Ready:
    """Sent once the core is warm. `info` is what /debug/config and /v1/models report."""

    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Fatal:
    """The core cannot go on (failed to start, or crashed); the server exits with this."""

    message: str
