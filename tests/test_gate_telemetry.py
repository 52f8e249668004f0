"""gate.telemetry: /proc/stat busy CPUs, the NVML sampler, server log scans, versions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from gate.records import GpuSample
from gate.run.host import gather_versions, host_info
from gate.run.telemetry import GpuSampler, ProcessCpu, SiblingBusy, read_proc_stat, scan_log

STAT_HEADER = "cpu  400 0 100 1500 0 0 0 0 0 0\n"
STAT_TAIL = "intr 12345 0 0\nctxt 999\nbtime 1700000000\nprocesses 42\n"


def write_stat(path: Path, rows: dict[int, tuple[int, ...]]) -> Path:
    """rows: cpu -> (user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice)."""
    lines = [f"cpu{cpu} " + " ".join(map(str, ticks)) for cpu, ticks in rows.items()]
    path.write_text(STAT_HEADER + "\n".join(lines) + "\n" + STAT_TAIL)
    return path


def test_read_proc_stat_counts_iowait_as_idle_and_guest_inside_user(tmp_path):
    path = write_stat(tmp_path / "stat", {0: (10, 1, 4, 70, 5, 2, 3, 5, 7, 0),
                                          1: (0, 0, 0, 100, 0, 0, 0, 0, 0, 0)})
    assert read_proc_stat(path) == {0: (25, 100), 1: (0, 100)}


def test_read_proc_stat_of_this_machine():
    stats = read_proc_stat()
    assert set(os.sched_getaffinity(0)) <= set(stats)
    assert all(0 <= busy <= total for busy, total in stats.values())


def test_sibling_busy_sums_busy_fractions_outside_the_masks(tmp_path):
    path = tmp_path / "stat"
    idle = (0, 0, 0, 100, 0, 0, 0, 0, 0, 0)
    write_stat(path, {cpu: idle for cpu in range(4)})
    busy = SiblingBusy(exclude=[0, 1], allowed=range(4), path=path)
    busy.start()
    write_stat(path, {0: (200, 0, 0, 100, 0, 0, 0, 0, 0, 0),  # masked: not counted
                      1: (200, 0, 0, 100, 0, 0, 0, 0, 0, 0),
                      2: (50, 0, 25, 125, 0, 0, 0, 0, 0, 0),  # 75 of 100 busy
                      3: (10, 0, 0, 140, 50, 0, 0, 0, 0, 0)})  # 10 of 100; iowait is idle
    assert busy.stop() == 0.85


def test_sibling_busy_is_none_when_everything_is_masked_or_unreadable(tmp_path):
    path = write_stat(tmp_path / "stat", {0: (0, 0, 0, 100, 0, 0, 0, 0, 0, 0)})
    masked = SiblingBusy(exclude=[0, 1], allowed=[0, 1], path=path)
    masked.start()
    assert masked.stop() is None
    missing = SiblingBusy(exclude=[0], allowed=[0, 1], path=tmp_path / "absent")
    missing.start()
    assert missing.stop() is None


def test_sibling_busy_on_this_machine():
    allowed = os.sched_getaffinity(0)
    busy = SiblingBusy(exclude=[min(allowed)], allowed=allowed)
    busy.start()
    time.sleep(0.05)
    result = busy.stop()
    if len(allowed) == 1:
        assert result is None
    else:
        assert 0.0 <= result <= len(allowed)


SAMPLE_LOG = """\
2026-12-01 10:00:00 resident.server INFO engine core started (pid 12)
Traceback (most recent call last):
  File "x.py", line 1, in <module>
ValueError: bad
W1201 torch/_dynamo/convert_frame.py] torch._dynamo hit config.recompile_limit (8)
W1201 torch._dynamo hit config.cache_size_limit (8)
   function: 'forward' reached the Recompile Limit
Traceback (most recent call last):
  File "y.py", line 2
RuntimeError: worse
    Traceback (most recent call last) is indented here, so it is not counted
"""


def test_scan_log_counts_tracebacks_and_recompile_limit_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(SAMPLE_LOG)
    assert scan_log(log) == (2, 3)
    assert scan_log(tmp_path / "absent.log") == (0, 0)
    log.write_bytes(b"\xff\xfe binary noise\nTraceback (most recent call last):\n")
    assert scan_log(log) == (1, 0)


def test_gpu_sampler_without_nvml_returns_none_and_leaves_no_thread():
    threads = threading.active_count()
    with GpuSampler(0, interval_s=0.01, nvml=FailingNvml()) as sampler:
        time.sleep(0.02)
    assert sampler.sample is None
    assert threading.active_count() == threads


def test_gpu_sampler_with_the_real_pynvml_never_raises():
    """Here (no GPU) NVML fails to load: None. On a GPU host it returns readings."""
    threads = threading.active_count()
    sampler = GpuSampler(0, interval_s=0.01)
    sampler.start()
    time.sleep(0.05)
    sample = sampler.stop()
    assert sample is None or isinstance(sample, GpuSample)
    assert threading.active_count() == threads
    assert sampler.stop() is None  # stopping twice is harmless


class FailingNvml:
    """An NVML whose library is missing, as pynvml behaves on a host without a driver."""

    def nvmlInit(self):
        raise OSError("NVML Shared Library Not Found")


class FakeNvml:
    """A stand-in for pynvml with one GPU whose readings step through fixed values."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self):
        self.reads = 0
        self.open = False

    def nvmlInit(self):
        self.open = True

    def nvmlShutdown(self):
        self.open = False

    def nvmlDeviceGetHandleByIndex(self, index):
        if index != 0:
            raise RuntimeError("invalid argument")
        return "gpu0"

    def nvmlDeviceGetClockInfo(self, handle, clock):
        self.reads += 1
        return (1980 - self.reads % 3) if clock == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=90)

    def nvmlDeviceGetPowerUsage(self, handle):
        raise RuntimeError("not supported")

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 40 + self.reads


def test_gpu_sampler_reports_medians_and_the_hottest_reading():
    nvml = FakeNvml()
    threads = threading.active_count()
    with GpuSampler(0, interval_s=0.005, nvml=nvml) as sampler:
        time.sleep(0.1)
        assert threading.active_count() == threads + 1
    sample = sampler.sample
    assert threading.active_count() == threads
    assert not nvml.open
    assert 1978 <= sample.sm_clock_mhz <= 1980
    assert sample.mem_clock_mhz == 3201
    assert sample.utilization_pct == 90
    assert sample.power_w is None
    assert sample.temperature_c_max == 40 + nvml.reads
    assert nvml.reads > 3


def test_gpu_sampler_on_a_missing_gpu_is_a_no_op():
    nvml = FakeNvml()
    for gpu in (3, None):
        sampler = GpuSampler(gpu, nvml=nvml)
        sampler.start()
        assert sampler.stop() is None
        assert not nvml.open


def test_gather_versions_names_every_package():
    versions = gather_versions()
    assert set(versions) == {"torch", "triton", "flashinfer", "fla", "transformers", "pandas",
                             "aiohttp", "python", "gpus"}
    import pandas

    assert versions["pandas"] == pandas.__version__
    assert versions["python"].count(".") == 2


def test_host_info_describes_this_machine():
    info = host_info()
    assert info["hostname"]
    assert info["logical_cpus"] == os.cpu_count()
    assert info["allowed_cpus"]
    assert info["memory_gib"] > 0
    assert set(info) == {"hostname", "cpu_model", "logical_cpus", "allowed_cpus", "memory_gib",
                         "client_event_loop"}
    assert info["client_event_loop"] in ("asyncio", "uvloop")



SPIN_S = 0.6  # CPU seconds the child spends, however busy the host
_CHILD = (f"import time\nend = time.process_time() + {SPIN_S}\n"
          f"while time.process_time() < end: pass\ntime.sleep(30)")
_PARENT = (f"import subprocess, sys, time; time.sleep(0.2); "
           f"subprocess.Popen([sys.executable, '-c', {_CHILD!r}]); time.sleep(30)")


def test_process_cpu_counts_a_descendant_apart_from_the_process():
    """A parent that only sleeps, and its child that spins: the child's CPU is the
    descendants', not the parent's."""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], start_new_session=True)
    try:
        cpu = ProcessCpu(parent.pid)
        cpu.start()
        time.sleep(0.5 + 2 * SPIN_S + 0.5)  # the child starts, spins, then sleeps
        own, descendants = cpu.stop()
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    assert own is not None and own < 0.3
    assert SPIN_S <= descendants < SPIN_S + 0.5


def test_process_cpu_of_a_process_that_is_gone_is_none():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    cpu = ProcessCpu(process.pid)
    cpu.start()
    assert cpu.stop() == (None, None)
