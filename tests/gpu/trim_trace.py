"""Cuts a torch.profiler Chrome trace down to a few of its steps, for a test fixture: the host
events inside those steps' `resident.step` ranges, the device events their launches made, and
the trace's metadata.

    python3 tests/gpu/trim_trace.py IN.json.gz OUT.json.gz --first 40 --steps 6
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from resident.profiling.timeline import STEP_RANGE
from resident.profiling.torch_trace import DEVICE_CATEGORIES


def trim(trace: dict, first: int, num_steps: int) -> dict:
    events = trace["traceEvents"]
    steps = sorted((e for e in events if e.get("name") == STEP_RANGE and e.get("ph") == "X"
                    and e.get("cat") == "user_annotation"),
                   key=lambda e: e["ts"])[first:first + num_steps]
    if len(steps) < num_steps:
        raise SystemExit(f"the trace has {len(steps) + first} steps, fewer than asked")
    start, end = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
    host = [e for e in events if e.get("cat") not in DEVICE_CATEGORIES and "dur" in e
            and start <= e["ts"] and e["ts"] + e["dur"] <= end]
    launched = {e["args"]["correlation"] for e in host if "correlation" in e.get("args", {})}
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES
              and e.get("args", {}).get("correlation") in launched]
    meta = [e for e in events if e.get("ph") == "M"]
    return {key: value for key, value in trace.items() if key != "traceEvents"} | {
        "traceEvents": meta + host + device}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--first", type=int, default=40, help="steps skipped")
    parser.add_argument("--steps", type=int, default=6, help="steps kept")
    args = parser.parse_args()
    with gzip.open(args.source, "rt") as file:
        trace = json.load(file)
    with gzip.open(args.dest, "wt") as file:
        json.dump(trim(trace, args.first, args.steps), file, separators=(",", ":"))
    print(f"{args.dest}: {args.dest.stat().st_size} bytes")


if __name__ == "__main__":
    main()
