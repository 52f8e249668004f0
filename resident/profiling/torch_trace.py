"""A torch.profiler (Kineto) Chrome trace as a Timeline.

Kineto writes complete events (`ph` "X", `ts`/`dur` in µs): user annotations (our step and kind
ranges), `cuda_runtime` and `cuda_driver` calls (cudaLaunchKernel, cuLaunchKernel for Triton,
cudaGraphLaunch, cudaMemcpyAsync), and on the GPU `kernel`, `gpu_memcpy` and `gpu_memset`, each
with `args.correlation` naming the call that launched it. The kernels of a graph replay carry
the cudaGraphLaunch's correlation id (CUPTI records graph nodes individually). A trace with no
GPU events (CPU only) yields the step thread's top-level CPU ops instead.
"""

from __future__ import annotations

from typing import Any

from resident.profiling.timeline import (
    KIND_PREFIX,
    STEP_RANGE,
    DeviceOp,
    Range,
    StepIndex,
    Timeline,
    steps_from_ranges,
)

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})


def from_chrome_trace(trace: dict[str, Any]) -> Timeline:
    """The trace's steps and the device ops each launched (module docstring)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    ranges = [Range(e["name"], e["ts"], e["ts"] + e["dur"], e.get("tid", 0)) for e in events
              if e.get("cat") == "user_annotation"
              and (e["name"] == STEP_RANGE or e["name"].startswith(KIND_PREFIX))]
    steps = steps_from_ranges(ranges)
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    if device:
        ops, unattributed = _device_ops(events, device, StepIndex(steps))
        return Timeline("torch.profiler", "cuda", tuple(steps), tuple(ops), unattributed)
    step_threads = {r.thread for r in ranges if r.name == STEP_RANGE}
    ops = _top_level_cpu_ops(events, StepIndex(steps), step_threads)
    return Timeline("torch.profiler", "cpu", tuple(steps), tuple(ops))


def _device_ops(events: list[dict], device: list[dict],
                steps: StepIndex) -> tuple[list[DeviceOp], int]:
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
    ops, unattributed = [], 0
    for event in device:
        correlation = event.get("args", {}).get("correlation")
        launch = launches.get(correlation)
        step = steps.find(launch["ts"]) if launch is not None else None
        if step is None:
            unattributed += 1
            continue
        ops.append(DeviceOp(event["name"], event["ts"], event["dur"], step, correlation,
                            "GraphLaunch" in launch["name"]))
    return ops, unattributed


def _top_level_cpu_ops(events: list[dict], steps: StepIndex,
                       threads: set[int]) -> list[DeviceOp]:
    """CPU ops on the step thread not inside another op, each a launch of its own."""
    ops: list[DeviceOp] = []
    cpu = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("tid") in threads),
                 key=lambda e: (e["ts"], -e["dur"]))
    covered_until = float("-inf")
    for number, event in enumerate(cpu):
        if event["ts"] < covered_until:
            continue  # inside the op before it
        covered_until = event["ts"] + event["dur"]
        step = steps.find(event["ts"])
        if step is not None:
            ops.append(DeviceOp(event["name"], event["ts"], event["dur"], step, number, False))
    return ops
