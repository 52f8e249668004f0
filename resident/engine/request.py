"""Request: one completion's tokens and progress through prefill and decode."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from resident.engine.types import FINISH_LENGTH, FINISH_STOP, SamplingParams

PENDING_TOKEN = -1  # a sampled token not yet read back (append_pending, then resolve)


class Status(enum.Enum):
    WAITING = "waiting"  # holds nothing yet
    RUNNING = "running"  # holds KV pages and a state slot
    OFFLOADED = "offloaded"  # its KV and state sit in host memory
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: int
    eos_token_ids: tuple[int, ...] = ()
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV and state are in the caches
    num_cached_tokens: int = 0  # prompt tokens a prefix cache hit restored (engine/prefix.py)
    cache_salt: str | None = None  # cached prefixes are shared only under the same salt
    status: Status = Status.WAITING
    last_run_step: int = -1
    finish_reason: str | None = None
    # the host's monotonic clock at arrival (the API's receipt, or the engine's intake),
    # admission and first token (latency.py)
    arrived_s: float = 0.0
    admitted_s: float | None = None
    first_token_s: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_total_tokens(self) -> int:
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    @property
    def is_decode_ready(self) -> bool:
        return (self.num_computed == self.num_tokens - 1 and bool(self.output_ids)
                and self.finish_reason is None)

    def next_tokens(self, num_new: int) -> list[int]:
        if self.is_prefilling:
            return self.prompt_ids[self.num_computed:self.num_computed + num_new]
        return [self.output_ids[-1]]

    def append_pending(self) -> None:
        """A token was sampled on the device and is not read back yet: it takes its place (so
        the next step can be scheduled around it) and max_tokens is decided, which needs no
        value."""
        self.output_ids.append(PENDING_TOKEN)
        if len(self.output_ids) >= self.params.max_tokens:
            self.finish_reason = FINISH_LENGTH

    def resolve(self, token: int) -> None:
        """The pending token's value: a stop or EOS token finishes the request."""
        self.output_ids[-1] = token
        params = self.params
        if not params.ignore_eos and token in self.eos_token_ids or token in params.stop_token_ids:
            self.finish_reason = FINISH_STOP
