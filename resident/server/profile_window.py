"""Profile windows in the engine core: POST /debug/profile opens one over the next N steps (or
S seconds, whichever ends first); each step in it is marked for the tool (profiling/timeline.py:
a STEP_RANGE range around the loop that ran it, a zero-length kind range inside), and when it
closes the core answers with the trace's path and its summary.

Tools: `torch` runs torch.profiler (CPU activity, and CUDA activity on a GPU: graph replays'
kernels included) and writes a gzipped Chrome trace (open it in Perfetto or chrome://tracing);
`nsys` calls cudaProfilerStart/Stop and marks steps with NVTX, for a server that runs under
`nsys profile --capture-range=cudaProfilerApi`; the trace is then nsys's report, summarized by
whoever ran nsys (the gate).

Off unless asked: with no window open, the step path pays two method calls that return at once.
torch is imported only when a window opens (this module is loaded by the API process too).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from resident.profiling.summary import summarize
from resident.profiling.timeline import KIND_PREFIX, STEP_RANGE
from resident.profiling.torch_trace import from_chrome_trace
from resident.server.protocol import ProfileQuery

log = logging.getLogger("resident.core")
TOOLS = ("torch", "nsys")


def profile_dir(configured: str) -> Path:
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "resident-profiles"


class ProfileWindows:
    """The core's profiling: at most one window open; `open_step`/`close_step` bracket each
    loop that runs a step, `poll` closes a window whose steps or time are up."""

    def __init__(self, out_dir: Path, device_type: str) -> None:
        self._out_dir = out_dir
        self._device_type = device_type
        self._window: _Window | None = None

    def request(self, query: ProfileQuery) -> dict[str, Any] | None:
        """Opens a window; the immediate answer when it cannot be opened, else None (the
        answer comes from `poll` when it closes)."""
        if self._window is not None:
            return {"error": "a profile window is already open", "status": 409}
        if query.tool == "nsys" and self._device_type != "cuda":
            return {"error": "tool nsys needs a CUDA device", "status": 400}
        try:
            self._window = _Window(query, self._out_dir, self._device_type)
        except Exception as error:  # noqa: BLE001 - the profiler failing must not stop serving
            log.exception("opening a profile window failed")
            return {"error": f"the profiler could not start: {type(error).__name__}: {error}",
                    "status": 500}
        log.info("profile window open: %d steps or %g s (%s)", query.steps, query.seconds,
                 query.tool)
        return None

    def open_step(self) -> None:
        if self._window is not None:
            self._window.open_step()

    def close_step(self, kind: str | None) -> None:
        if self._window is not None:
            self._window.close_step(kind)

    def poll(self) -> tuple[ProfileQuery, dict[str, Any]] | None:
        """(query, answer) of a window that has just closed, or None."""
        window = self._window
        if window is None or not window.done:
            return None
        self._window = None
        return window.query, window.finish()


class _Window:
    def __init__(self, query: ProfileQuery, out_dir: Path, device_type: str) -> None:
        import torch

        self.query = query
        self._torch = torch
        self._cuda = device_type == "cuda"
        self._out_dir = out_dir
        self._deadline = time.monotonic() + query.seconds
        self._started = time.monotonic()
        self._num_steps = 0
        self._step_range = None  # the open step's range (torch)
        self._step_open = False
        self._profiler = None
        if query.tool == "nsys":
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        else:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self._cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.start()

    @property
    def done(self) -> bool:
        return self._num_steps >= self.query.steps or time.monotonic() >= self._deadline

    def open_step(self) -> None:
        if self._profiler is not None:
            self._step_range = self._torch.profiler.record_function(STEP_RANGE)
            self._step_range.__enter__()
        else:
            self._torch.cuda.nvtx.range_push(STEP_RANGE)
        self._step_open = True

    def close_step(self, kind: str | None) -> None:
        """Ends the open step's range, marked with its kind (no kind: the loop ran no step,
        and the summary drops the range). A window opened during this loop's intake has no
        step open: its steps start with the next loop."""
        if not self._step_open:
            return
        if kind is not None:
            self._mark(KIND_PREFIX + kind)
        if self._profiler is not None:
            self._step_range.__exit__(None, None, None)
        else:
            self._torch.cuda.nvtx.range_pop()
        self._step_open = False
        self._num_steps += kind is not None

    def _mark(self, name: str) -> None:
        """A zero-length range."""
        if self._profiler is not None:
            with self._torch.profiler.record_function(name):
                pass
        else:
            self._torch.cuda.nvtx.range_push(name)
            self._torch.cuda.nvtx.range_pop()

    def finish(self) -> dict[str, Any]:
        """Stops the tool; the answer: the trace file and its summary (torch), or what the
        capture range held (nsys)."""
        seconds = time.monotonic() - self._started
        answer: dict[str, Any] = {"tool": self.query.tool, "steps": self._num_steps,
                                  "seconds": round(seconds, 3)}
        try:
            if self._cuda:
                self._torch.cuda.synchronize()  # the window's kernels are all in the trace
            if self._profiler is None:
                self._torch.cuda.profiler.stop()
                return answer
            return answer | self._write_trace()
        except Exception as error:  # noqa: BLE001 - the profiler failing must not stop serving
            log.exception("closing a profile window failed")
            return answer | {"error": f"the profile failed: {type(error).__name__}: {error}",
                             "status": 500}

    def _write_trace(self) -> dict[str, Any]:
        self._profiler.stop()
        self._out_dir.mkdir(parents=True, exist_ok=True)
        path = self._out_dir / f"profile-{os.getpid()}-{self.query.nonce}.json.gz"
        self._profiler.export_chrome_trace(str(path))
        log.info("profile window closed: %d steps, trace %s", self._num_steps, path)
        answer: dict[str, Any] = {"trace": str(path), "summary": None}
        try:
            with gzip.open(path, "rt") as trace:
                answer["summary"] = summarize(from_chrome_trace(json.load(trace))).to_dict()
        except Exception as error:  # noqa: BLE001 - the trace is kept, and stays readable
            log.exception("summarizing the profile failed")
            answer["summary_error"] = f"{type(error).__name__}: {error}"
        return answer
