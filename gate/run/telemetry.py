"""Telemetry around a gate run: GPU readings (NVML), busy CPUs outside the masks, server logs.

- `GpuSampler` samples one GPU from a background thread (clocks, utilisation, power,
  temperature) and returns medians; without NVML (no GPU, no driver, no pynvml) it is a no-op.
- `SiblingBusy` counts how many CPUs outside the server and client masks were busy over a run
  (from /proc/stat): other work on the host that could have disturbed the measurement.
- `ProcessCpu` reads the CPU time of a server's launched process (a resident arm's API
  process) and of its descendants (the engine core) over a run, from /proc/<pid>/stat: which
  side of the server the host time went to, and whether the API's one event loop was full.
- `scan_log` counts tracebacks and recompile-limit lines in a server log.
(gate/run/host.py describes the software and the host for the manifest.)
"""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from gate.records import GpuSample

PROC_STAT = Path("/proc/stat")
TRACEBACK_PREFIX = "Traceback (most recent call last)"
RECOMPILE_MARKERS = ("recompile_limit", "cache_size_limit", "recompile limit")


def read_proc_stat(path: Path = PROC_STAT) -> dict[int, tuple[int, int]]:
    """Per CPU: (busy jiffies, total jiffies); idle counts idle + iowait, guest time is in user.

    Raises OSError when the file cannot be read.
    """
    stats = {}
    for line in path.read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or len(fields) < 4:
            continue
        ticks = [int(value) for value in fields[:8]]  # user .. steal; guest is inside user
        total = sum(ticks)
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        stats[int(name[3:])] = (total - idle, total)
    return stats


class SiblingBusy:
    """Busy CPUs outside the server and client masks over an interval (`start` .. `stop`)."""

    def __init__(self, exclude: Iterable[int], allowed: Iterable[int],
                 path: Path = PROC_STAT) -> None:
        self.cpus = sorted(set(allowed) - set(exclude))
        self.path = path
        self._before: dict[int, tuple[int, int]] | None = None

    def _snapshot(self) -> dict[int, tuple[int, int]] | None:
        try:
            return read_proc_stat(self.path)
        except (OSError, ValueError):
            return None

    def start(self) -> None:
        """Takes the first snapshot."""
        self._before = self._snapshot()

    def stop(self) -> float | None:
        """Sum over the CPUs outside the masks of their busy fraction, to 2 decimals.

        None when every allowed CPU is in a mask, or /proc/stat could not be read.
        """
        before, self._before = self._before, None
        after = self._snapshot()
        if not self.cpus or before is None or after is None:
            return None
        busy = 0.0
        for cpu in self.cpus:
            if cpu not in before or cpu not in after:
                return None
            d_busy = after[cpu][0] - before[cpu][0]
            d_total = after[cpu][1] - before[cpu][1]
            busy += d_busy / d_total if d_total > 0 else 0.0
        return round(busy, 2)


CLOCK_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_stat(pid: int, proc: Path = Path("/proc")) -> tuple[int, float, float] | None:
    """(parent pid, user CPU seconds, system CPU seconds) of a pid from its /proc stat, every
    thread's, counted in clock ticks (CLOCK_TICK a second); None where it cannot be read (gone,
    or no /proc)."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[11]) / CLOCK_TICK, int(fields[12]) / CLOCK_TICK


class ProcessCpu:
    """CPU seconds (user + system, every thread) of one process and of its descendants over an
    interval (`start` .. `stop`), in the kernel's clock ticks (10 ms: a run of a second reads
    to about 1%). Descendants are found at each snapshot through the parent pids in /proc; one
    that exits between the snapshots is not counted. Without /proc (not Linux), or once the
    process is gone, `stop` gives (None, None)."""

    def __init__(self, pid: int, proc: Path = Path("/proc")) -> None:
        self.pid, self.proc = pid, proc
        self._before: dict[int, float] | None = None

    def _stat(self, pid: int) -> tuple[int, float] | None:
        """(parent pid, CPU seconds) of a pid, or None when it cannot be read."""
        stat = read_stat(pid, self.proc)
        return None if stat is None else (stat[0], stat[1] + stat[2])

    def _snapshot(self) -> dict[int, float] | None:
        """CPU seconds of the process and of each descendant, by pid."""
        own = self._stat(self.pid)
        if own is None:
            return None
        stats = {}
        for entry in self.proc.iterdir():
            if entry.name.isdigit() and (stat := self._stat(int(entry.name))) is not None:
                stats[int(entry.name)] = stat
        children: dict[int, list[int]] = {}
        for pid, (parent, _) in stats.items():
            children.setdefault(parent, []).append(pid)
        tree, todo = {self.pid: own[1]}, list(children.get(self.pid, ()))
        while todo:
            pid = todo.pop()
            tree[pid] = stats[pid][1]
            todo += children.get(pid, ())
        return tree

    def start(self) -> None:
        self._before = self._snapshot()

    def stop(self) -> tuple[float | None, float | None]:
        """(the process's CPU seconds, its descendants' together) since `start`."""
        before, self._before = self._before, None
        after = self._snapshot()
        if before is None or after is None:
            return None, None
        descendants = sum(seconds - before.get(pid, 0.0)
                          for pid, seconds in after.items() if pid != self.pid)
        return round(after[self.pid] - before[self.pid], 3), round(descendants, 3)


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _reading(read: Callable[[], float]) -> float | None:
    try:
        return float(read())
    except Exception:  # a GPU without this sensor, or NVML gone: leave the reading out
        return None


class GpuSampler:
    """Samples one GPU through NVML every `interval_s` on a daemon thread.

    Use as `with GpuSampler(0) as sampler: ...; sample = sampler.sample`, or `start()` then
    `stop()`. Without pynvml or a working NVML, `start()` does nothing and `stop()` returns None.
    `gpu` is an NVML index (PCI bus order); None samples nothing. `nvml` replaces the pynvml
    module (tests).
    """

    FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "utilization_pct", "power_w", "temperature_c")

    def __init__(self, gpu: int | None, interval_s: float = 0.2, nvml: Any = None) -> None:
        self.gpu = gpu
        self.interval_s = interval_s
        self.sample: GpuSample | None = None
        self._nvml = nvml
        self._handle: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: dict[str, list[float]] = {name: [] for name in self.FIELDS}

    def __enter__(self) -> GpuSampler:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def _open(self) -> bool:
        if self.gpu is None:
            return False
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                return False
        try:
            nvml.nvmlInit()
        except Exception:
            return False
        try:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(self.gpu)
        except Exception:
            nvml.nvmlShutdown()
            return False
        self._nvml = nvml
        return True

    def start(self) -> None:
        """Opens NVML and starts sampling; a no-op without NVML or when already started."""
        if self._thread is not None or not self._open():
            return
        self._stop.clear()
        self._samples = {name: [] for name in self.FIELDS}
        self._thread = threading.Thread(target=self._run, name=f"gpu-sampler-{self.gpu}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._read()
        while not self._stop.wait(self.interval_s):
            self._read()

    def _read(self) -> None:
        nvml, handle = self._nvml, self._handle
        readings = (
            lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
            lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # mW
            lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
        )
        for name, read in zip(self.FIELDS, readings, strict=True):
            value = _reading(read)
            if value is not None:
                self._samples[name].append(value)

    def stop(self) -> GpuSample | None:
        """Stops the thread, shuts NVML down and returns the medians (None if never started)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return None
        self._stop.set()
        thread.join(timeout=max(5.0, 10 * self.interval_s))
        try:
            if not any(self._samples.values()):
                self._read()
        finally:
            self._nvml.nvmlShutdown()
        samples = self._samples
        temperatures = samples["temperature_c"]
        self.sample = GpuSample(
            sm_clock_mhz=_median(samples["sm_clock_mhz"]),
            mem_clock_mhz=_median(samples["mem_clock_mhz"]),
            utilization_pct=_median(samples["utilization_pct"]),
            power_w=_median(samples["power_w"]),
            temperature_c_max=max(temperatures) if temperatures else None,
        )
        return self.sample


def _is_recompile_line(line: str) -> bool:
    lowered = line.lower()
    return any(marker in lowered for marker in RECOMPILE_MARKERS)


def scan_log(path: Path) -> tuple[int, int]:
    """(tracebacks, recompile-limit lines) in a server log; a missing log is (0, 0)."""
    tracebacks = recompiles = 0
    try:
        with path.open(errors="replace") as log:
            for line in log:
                tracebacks += line.startswith(TRACEBACK_PREFIX)
                recompiles += _is_recompile_line(line)
    except FileNotFoundError:
        return 0, 0
    return tracebacks, recompiles
