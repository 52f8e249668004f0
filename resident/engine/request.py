"""Request: one completion's tokens and progress through prefill and decode."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from resident.server.protocol import FINISH_LENGTH, FINISH_STOP, SamplingParams


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
    status: Status = Status.WAITING
    last_run_step: int = -1
    finish_reason: str | None = None

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
        return self.num_computed == self.num_tokens - 1 and bool(self.output_ids)

    def next_tokens(self, num_new: int) -> list[int]:
        if self.is_prefilling:
            return self.prompt_ids[self.num_computed:self.num_computed + num_new]
        return [self.output_ids[-1]]

    def append(self, token: int) -> None:
        """Records a sampled token and decides whether the request is done."""
        self.output_ids.append(token)
        params = self.params
        if not params.ignore_eos and token in self.eos_token_ids or token in params.stop_token_ids:
            self.finish_reason = FINISH_STOP
        elif len(self.output_ids) >= params.max_tokens:
            self.finish_reason = FINISH_LENGTH
