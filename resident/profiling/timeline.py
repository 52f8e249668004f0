"""A profile window as the summary reads it, whichever tool recorded it: the engine core's steps
(host ranges, each with its kind) and the device work each step launched.

The engine core marks every step of a window with a range named STEP_RANGE and, inside it, a
zero-length range KIND_PREFIX + kind (the kind is known only once the step has been planned).
torch.profiler records them as user annotations, nsys as NVTX push/pop ranges. A device op
belongs to the step whose host range holds the API call that launched it (matched by the
tool's correlation id), so work that runs on the GPU after its step's host range ended is still
that step's. Every kernel of one CUDA graph replay shares its launch's correlation id.

Times are microseconds on the tool's clock; only differences are used.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

STEP_RANGE = "resident.step"
KIND_PREFIX = "resident.kind."


@dataclass(frozen=True)
class StepRange:
    """One engine-core loop that ran a step: intake, step, outputs sent (host time)."""

    kind: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class DeviceOp:
    """A kernel, memcpy or memset (or, in a CPU-only profile, a top-level CPU op)."""

    name: str
    start_us: float
    dur_us: float
    step: int  # index into Timeline.steps
    launch: int  # the launching call's correlation id: one per graph replay, kernel or op
    in_graph: bool  # launched by a CUDA graph replay

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(frozen=True)
class Timeline:
    """`activity` is "cuda" (device ops are GPU work) or "cpu" (no device: the ops are the
    step thread's top-level CPU ops). `unattributed` counts device ops launched outside every
    step (between steps, or before the window's first)."""

    tool: str
    activity: str
    steps: tuple[StepRange, ...]
    ops: tuple[DeviceOp, ...]
    unattributed: int = 0


@dataclass(frozen=True)
class Range:
    """A named host range on one thread, as a tool recorded it."""

    name: str
    start_us: float
    end_us: float
    thread: int


def steps_from_ranges(ranges: list[Range]) -> list[StepRange]:
    """The STEP_RANGE ranges, each with the kind of the KIND_PREFIX range inside it; a step range
    with no kind inside (the window closed mid-step) is dropped."""
    steps = sorted((r for r in ranges if r.name == STEP_RANGE), key=lambda r: r.start_us)
    kinds = sorted((r for r in ranges if r.name.startswith(KIND_PREFIX)),
                   key=lambda r: r.start_us)
    starts = [k.start_us for k in kinds]
    found = []
    for step in steps:
        index = bisect.bisect_left(starts, step.start_us)
        if index < len(kinds) and kinds[index].start_us <= step.end_us \
                and kinds[index].thread == step.thread:
            found.append(StepRange(kinds[index].name[len(KIND_PREFIX):], step.start_us,
                                   step.end_us))
    return found


class StepIndex:
    """Finds the step whose host range holds a time."""

    def __init__(self, steps: list[StepRange]) -> None:
        self._steps = steps
        self._starts = [s.start_us for s in steps]

    def find(self, time_us: float) -> int | None:
        index = bisect.bisect_right(self._starts, time_us) - 1
        if index >= 0 and time_us <= self._steps[index].end_us:
            return index
        return None
