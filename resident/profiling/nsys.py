"""Nsight Systems reports as a Timeline: the CSVs of `nsys stats --format csv` for three reports.

- `cuda_gpu_trace`: one row per kernel, memcpy or memset (`Start (ns)`, `Duration (ns)`,
  `CorrId`, `Name`); with `nsys profile --cuda-graph-trace=node` a graph replay's kernels are
  rows of their own carrying the cudaGraphLaunch's CorrId;
- `cuda_api_trace`: the host's CUDA calls (`Start (ns)`, `Name`, `CorrID`, `Tid`), where
  each GPU row's CorrId finds the call that launched it;
- `nvtx_pushpop_trace`: the engine core's step and kind ranges (`Start (ns)`, `End (ns)`,
  `Name`, `TID`).

nsys prints notices before a report's header (`NOTICE: ...`, `Processing [...]`), and the case
of some column names changed between versions (`Pid` / `PID`): both are tolerated.
"""

from __future__ import annotations

import csv
import io

from resident.profiling.timeline import DeviceOp, Range, StepIndex, Timeline, steps_from_ranges

REPORTS = ("cuda_gpu_trace", "cuda_api_trace", "nvtx_pushpop_trace")


class NsysFormatError(ValueError):
    """A report that is not the CSV this parser knows; names the report and what is missing."""


def read_report(text: str, report: str, columns: tuple[str, ...]) -> list[dict[str, str]]:
    """The report's rows keyed by lower-case column names, from its header on."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Start (ns)")), None)
    if start is None:
        raise NsysFormatError(f"{report}: no header line starting 'Start (ns)'")
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    fields = {name.lower() for name in reader.fieldnames or []}
    missing = [c for c in columns if c not in fields]
    if missing:
        raise NsysFormatError(f"{report}: missing columns {missing}")
    return [{k.lower(): v for k, v in row.items()} for row in reader if row]


def from_nsys_csv(gpu_trace: str, api_trace: str, nvtx_trace: str) -> Timeline:
    """The window's steps (NVTX) and the GPU work each launched (module docstring)."""
    nvtx = read_report(nvtx_trace, "nvtx_pushpop_trace", ("start (ns)", "end (ns)", "name", "tid"))
    steps = steps_from_ranges([Range(r["name"], _us(r["start (ns)"]), _us(r["end (ns)"]),
                                     int(r["tid"])) for r in nvtx if r["end (ns)"]])
    api = read_report(api_trace, "cuda_api_trace", ("start (ns)", "name", "corrid"))
    launches = {int(r["corrid"]): r for r in api if r["corrid"]}
    gpu = read_report(gpu_trace, "cuda_gpu_trace", ("start (ns)", "duration (ns)", "corrid",
                                                    "name"))
    index, ops, unattributed = StepIndex(steps), [], 0
    for row in gpu:
        correlation = int(row["corrid"])
        launch = launches.get(correlation)
        step = index.find(_us(launch["start (ns)"])) if launch is not None else None
        if step is None:
            unattributed += 1
            continue
        ops.append(DeviceOp(row["name"], _us(row["start (ns)"]), _us(row["duration (ns)"]),
                            step, correlation, "GraphLaunch" in launch["name"]))
    return Timeline("nsys", "cuda", tuple(steps), tuple(ops), unattributed)


def _us(nanoseconds: str) -> float:
    return int(nanoseconds) / 1000
