"""`resident-gate run --profile`: one profile window per arm and cell, in a steady load after the
cell's timed runs of the first round (the timed runs are never profiled).

The window is the server's own (POST /debug/profile, resident/server/profile_window.py); its
trace is copied into the session (`profiles/<arm>-c<N>.json.gz`) and summarized again here, by
the gate's code, so every arm's tables come from one reader whatever tree the arm runs. Records
go to profiles.jsonl; profile.md is rendered from them (report/profile.py).

The tool: torch.profiler. Where `nsys` is on PATH the manifest says so, and that the gate does
not drive it yet (resident/profiling/nsys.py reads its CSV reports into the same tables).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import time
from pathlib import Path
from typing import Any

from gate.run.load import LoadSpec, steady_load
from gate.run.server import Server
from resident.profiling.summary import summarize
from resident.profiling.torch_trace import from_chrome_trace

TRACES_DIR = "profiles"
SETTLE_S = 2.0  # the steady load reaches its concurrency before the window opens
WINDOW_CAP_S = 120.0  # a window closes after this even if its steps did not run


def profile_tool(device: str) -> dict[str, str]:
    """The manifest's `profile` entry: which tool makes the windows, and why that one."""
    nsys = shutil.which("nsys")
    if device != "cuda":
        why = ("CPU: torch.profiler's CPU activity; the 'kernels' are the step thread's "
               "top-level ops")
    elif nsys is None:
        why = "nsys is not on PATH"
    else:
        why = f"nsys is at {nsys}, but the gate does not drive nsys yet"
    return {"tool": "torch.profiler", "why": why}


async def profile_cell(server: Server, spec: LoadSpec, steps: int, out: Path, arm: str,
                       round_index: int) -> dict[str, Any]:
    """One window of `steps` steps in the middle of a steady load at the cell's concurrency;
    returns its profiles.jsonl record (with `error` when the server could not profile)."""
    record: dict[str, Any] = {"round": round_index, "arm": arm,
                              "concurrency": spec.concurrency, "steps": steps,
                              "started_at": time.time(), "trace": None, "summary": None,
                              "error": None}
    stop = asyncio.Event()
    load = asyncio.create_task(steady_load(server.url, spec, stop))
    try:
        await asyncio.sleep(SETTLE_S)
        status, answer = await server.request_json(
            "POST", "/debug/profile", {"steps": steps, "seconds": WINDOW_CAP_S},
            timeout_s=WINDOW_CAP_S + 300)
    finally:
        stop.set()
        await load
    if status != 200:
        message = (answer.get("error") or {}).get("message") if isinstance(answer, dict) else None
        record["error"] = (f"POST /debug/profile answered {status}: "
                           f"{message or 'no /debug/profile (an older tree?)'}")
        return record
    return record | _keep_trace(Path(answer["trace"]), out, f"{arm}-c{spec.concurrency}")


def _keep_trace(trace: Path, out: Path, name: str) -> dict[str, Any]:
    """Moves the server's trace into the session and summarizes it."""
    kept = out / TRACES_DIR / f"{name}.json.gz"
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(trace, kept)
    record: dict[str, Any] = {"trace": str(kept.relative_to(out))}
    try:
        with gzip.open(kept, "rt") as file:
            record["summary"] = summarize(from_chrome_trace(json.load(file))).to_dict()
    except Exception as error:  # noqa: BLE001 - the trace is kept; the session goes on
        record["error"] = f"summarizing {kept.name} failed: {type(error).__name__}: {error}"
    return record
