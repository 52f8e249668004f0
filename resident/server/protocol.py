"""Messages between the API process and the engine-core process.

Two ZMQ PUSH/PULL pipes over IPC carry pickled dataclasses: requests go API -> core, outputs and
replies go core -> API. The engine's own types (engine/types.py: EngineRequest, RequestOutput)
travel inside them. Nothing here imports torch: the API process never touches torch state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from resident.engine.types import EngineRequest, RequestOutput

# -- API -> core ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AddRequest:
    request: EngineRequest


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
class ProfileQuery:
    """Opens a profile window over the next `steps` steps or `seconds`, whichever ends first
    (server/profile_window.py); answered by StatsReply once it closes. `tool`: torch
    (torch.profiler, a trace file and its summary) or nsys (cudaProfilerStart/Stop and NVTX
    ranges for an `nsys profile --capture-range=cudaProfilerApi` around the server)."""

    nonce: int
    steps: int
    seconds: float
    tool: str = "torch"


@dataclass(frozen=True)
class Shutdown:
    pass


# -- core -> API ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepOutputs:
    outputs: list[RequestOutput]


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
