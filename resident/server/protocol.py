"""Messages between the API processes and the engine-core process.

Each API process has two ZMQ PUSH/PULL pipes over IPC to the core, carrying pickled
dataclasses: requests go API -> core, outputs and replies go core -> API (the AddRequests and
AbortRequests one turn of an API process's event loop queues travel as one list, in order). A
message that wants
an answer names its API process (`api_index`, 0 for the first): the core answers it, and a
request's outputs go to the process that added it (routing.py). The engine's own types
(engine/types.py: EngineRequest, RequestOutput) travel inside them. Nothing here imports torch:
the API processes never touch torch state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from resident.engine.types import EngineRequest, RequestOutput, is_plain, plain_output

IPC_PREFIX = "resident-ipc-"  # a server's IPC directories under the temp dir
PID_FILE = "serve.pid"  # in each: the server's pid (stale ones are removed: serve.py)

# -- API -> core ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AddRequest:
    request: EngineRequest
    api_index: int = 0  # the API process whose stream gets its outputs


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class StatsQuery:
    """Asks the core for its counters (for /metrics) and debug state, or (section) its phase
    timing, read or read then reset; answered by StatsReply."""

    nonce: int
    section: str = "stats"  # stats | phases | phases_reset
    api_index: int = 0


@dataclass(frozen=True)
class ProfileQuery:
    """Opens a profile window over the next `steps` steps or `seconds`, whichever ends first
    (server/profile_window.py); answered by StatsReply once it closes. `tool`: torch
    (torch.profiler, a trace file and its summary) or nsys (cudaProfilerStart/Stop and NVTX
    ranges for an `nsys profile --capture-range=cudaProfilerApi` around the server)."""

    nonce: int
    steps: int
    seconds: float
    tool: str = "torch"
    api_index: int = 0


@dataclass(frozen=True)
class ApiGone:
    """Sent by the first API process when another one died: the core aborts that process's
    requests and sends it nothing more."""

    api_index: int


@dataclass(frozen=True)
class Shutdown:
    pass


# -- core -> API ----------------------------------------------------------------------------


@dataclass
class StepOutputs:
    """A step's outputs for one API process. The plain ones of one token (`is_plain`: nothing
    else but the prompt's cached count; nearly every output of a decode step) travel as three
    columns, the others whole. A RequestOutput pickles through its Python `__reduce__`, a call
    a row (74 µs for 64 rows on the VM); the columns pickle in C, and the API routes a plain
    token without building a RequestOutput (client.py)."""

    request_ids: list[str]
    tokens: list[int]
    num_cached_tokens: list[int]
    others: list[RequestOutput]

    @classmethod
    def of(cls, outputs: Iterable[RequestOutput]) -> StepOutputs:
        step = cls([], [], [], [])
        for output in outputs:
            step.add(output)
        return step

    def add(self, output: RequestOutput) -> None:
        if len(output.new_token_ids) == 1 and is_plain(output):
            self.request_ids.append(output.request_id)
            self.tokens.append(output.new_token_ids[0])
            self.num_cached_tokens.append(output.num_cached_tokens)
        else:
            self.others.append(output)

    def outputs(self) -> list[RequestOutput]:
        """Every output as a RequestOutput: the plain ones, then the others."""
        plain = [plain_output(*parts) for parts in zip(self.request_ids, self.tokens,
                                                        self.num_cached_tokens, strict=True)]
        return plain + self.others


@dataclass(frozen=True)
class StatsReply:
    nonce: int
    stats: dict[str, Any]


@dataclass(frozen=True)
class Heartbeat:
    """The core is alive: sent when it has sent nothing else for a while (core.HEARTBEAT_S)."""


@dataclass(frozen=True)
class Ready:
    """Sent once the core is warm. `info` is what /debug/config and /v1/models report."""

    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Fatal:
    """The core cannot go on (failed to start, or crashed); the server exits with this.
    `message` is one line (the traceback stays in the core's log)."""

    message: str
