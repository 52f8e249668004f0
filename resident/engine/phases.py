"""Phase timing: where a step's time goes, per step kind (knob `phase_timing`, env
RESIDENT_PHASE_TIMING).

A step is timed from the engine core's intake to its outputs sent (or from schedule to emit when
the engine is stepped in process). Three keys are wall time: `step`; `event_sync`, the wait
for the GPU when sampling reads the tokens back; `window`, the wait before the next step is
launched ahead under `late_launch` (launch_window.py), the request pipe polled (its CPU, a spin,
is charged to no part). The rest is thread CPU time
(`time.thread_time`), lapped at the seams between phases and charged to the thread role that
owns each phase:

- `main`: intake, scheduling (the KV admission of the step's tokens included) and outputs;
- `gpu`: the step's launch (graph replay or eager forward), sampling and its sync, the commit;
- `plan`: building the step's inputs, in the parts below.

`plan`'s parts: `kv_plan` (block-table rows and KV write locations), `kv_stage` (the staged
inputs' H2D copies), `attention` (the attention backend's host plan), `gdn_linear` (GDN state
slots and fla's varlen metadata), `positions`, `resident` (the resident planner's plan, flush
and commit), `sampler` (the sampler's launches before its sync), `declare_admit_pad` (the
step's token ids and its padding rows), `rest` (the plan's remainder: buckets, metadata).

The step path is one thread, so the three roles are three shares of one thread's CPU; with
phase timing off the engine holds `NO_PHASES`, whose methods do nothing. Under `plan_ahead`
the next step's staging and launch run inside the step before it (`ahead`): they are charged
to their own step's kind, with their wall time, which the record they ran in gives up; so each
kind's means are its own steps' work, whatever ran before them. Scheduling the next step stays
in the record it ran in (the plan's kind is known only after it).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

PLAN_PARTS = ("kv_plan", "kv_stage", "attention", "gdn_linear", "positions", "resident",
              "sampler", "declare_admit_pad", "rest")
MAIN_PARTS = ("intake", "schedule", "outputs")
GPU_PARTS = ("launch", "sample_sync", "commit")
ROLES = {"main": MAIN_PARTS, "gpu": GPU_PARTS, "plan": PLAN_PARTS}
WALL_KEYS = ("step", "event_sync", "window")
REPORT_KEYS = (*WALL_KEYS, *ROLES, *PLAN_PARTS, "steps")


class PhaseTiming:
    """Sums of each phase per step kind since the last reset. One step is open at a time:
    `open` starts it (a nested `open` joins the one already open), `lap(part)` charges the
    thread CPU since the last lap to a part, `close(kind)` files the step under its kind (a
    step with no kind, an idle loop, is dropped)."""

    def __init__(self) -> None:
        self._sums: dict[str, Counter[str]] = {}
        self._depth = 0
        self._kind: str | None = None
        # a plain dict, not a Counter: a Counter's missing key costs a Python call (~0.3 us)
        # and each `ahead` makes a fresh one, ~2 us of a step's timing charged to its parts
        self._parts: dict[str, float] = {}
        self._wall = self._cpu = 0.0
        self._ahead_wall = 0.0  # wall seconds of the open step given to steps ahead

    def open(self) -> None:
        self._depth += 1
        if self._depth == 1:
            self._parts.clear()
            self._kind = None
            self._ahead_wall = 0.0
            self._wall, self._cpu = time.perf_counter(), time.thread_time()

    def lap(self, part: str) -> None:
        now = time.thread_time()
        parts = self._parts
        parts[part] = parts.get(part, 0.0) + now - self._cpu
        self._cpu = now

    def kind(self, kind: str) -> None:
        """The open step's kind, once its plan is made."""
        self._kind = kind

    @contextlib.contextmanager
    def ahead(self, kind: str) -> Iterator[None]:
        """Work for the next step, of `kind`, done inside the open one: its laps and its wall
        time are filed under `kind`, not under the open step."""
        outer, self._parts = self._parts, {}
        start = time.perf_counter()
        try:
            yield
        finally:
            wall = time.perf_counter() - start
            self._file(kind, self._parts, wall)
            self._ahead_wall += wall
            self._parts = outer

    def event_sync(self, wait: Callable[[], T]) -> T:
        """wait(), the host's wait on the GPU, timed as event_sync (wall)."""
        return self._time_wall("event_sync", wait)

    def window(self, wait: Callable[[], T]) -> T:
        """wait(), the host polling for arrivals before the next launch, timed as window
        (wall); the thread CPU it spins is dropped."""
        result = self._time_wall("window", wait)
        self._cpu = time.thread_time()
        return result

    def _time_wall(self, key: str, wait: Callable[[], T]) -> T:
        start = time.perf_counter()
        result = wait()
        self._parts[key] = self._parts.get(key, 0.0) + time.perf_counter() - start
        return result

    def close(self) -> None:
        self._depth -= 1
        if self._depth or self._kind is None:
            return
        wall = time.perf_counter() - self._wall - self._ahead_wall
        self._file(self._kind, self._parts, wall)["steps"] += 1

    def _file(self, kind: str, parts: dict[str, float], wall: float) -> Counter[str]:
        """Adds parts (thread CPU) and wall seconds to `kind`'s sums; returns them."""
        sums = self._sums.setdefault(kind, Counter())
        sums.update(parts)
        sums["step"] += wall
        return sums

    def reset(self) -> None:
        self._sums.clear()

    def report(self) -> dict[str, dict[str, float]]:
        """{kind: {key: ms per step}} for every REPORT_KEYS key, `steps` a count; a kind whose
        only work so far ran ahead (its step not done yet) is left out."""
        return {kind: _per_step(sums) for kind, sums in sorted(self._sums.items())
                if sums["steps"]}


def _per_step(sums: Counter[str]) -> dict[str, float]:
    steps = sums["steps"]
    row = {key: 1e3 * sums[key] / steps for key in WALL_KEYS}
    for role, parts in ROLES.items():
        row[role] = 1e3 * sum(sums[p] for p in parts) / steps
    row.update({part: 1e3 * sums[part] / steps for part in PLAN_PARTS})
    row["steps"] = steps
    return {key: round(value, 4) if key != "steps" else value for key, value in row.items()}


class NoPhases:
    """Phase timing off: every method does nothing."""

    def open(self) -> None:
        pass

    def lap(self, part: str) -> None:
        pass

    def kind(self, kind: str) -> None:
        pass

    def ahead(self, kind: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def event_sync(self, wait: Callable[[], T]) -> T:
        return wait()

    def window(self, wait: Callable[[], T]) -> T:
        return wait()

    def close(self) -> None:
        pass

    def reset(self) -> None:
        pass

    def report(self) -> dict[str, dict[str, float]]:
        return {}


NO_PHASES = NoPhases()
