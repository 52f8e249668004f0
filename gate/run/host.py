"""The host and its software as a session's manifest records them: package versions, GPUs and
driver, hostname, CPUs and memory, and how loaded the host was around each round."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

from gate.run.topology import format_cpu_list
from resident import eventloop

# Distribution names to try for each package, first found wins.
PACKAGES = {
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "fla": ("fla-core", "flash-linear-attention"),
    "transformers": ("transformers",),
    "pandas": ("pandas",),
    "aiohttp": ("aiohttp",),
}
NVIDIA_SMI_TIMEOUT_S = 10.0


def _version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def nvidia_smi_gpus() -> str | None:
    """`nvidia-smi` name and driver of each GPU ("NVIDIA H200, 570.86.15"; "; " between GPUs)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return "; ".join(lines) if done.returncode == 0 and lines else None


def gather_versions() -> dict[str, str | None]:
    """Versions of the packages a gate's numbers depend on (None: not installed), Python, and
    the GPUs with their driver from nvidia-smi (`gpus`, None without nvidia-smi).

    Reads package metadata only: nothing here imports torch.
    """
    versions = {key: _version(names) for key, names in PACKAGES.items()}
    versions["python"] = platform.python_version()
    versions["gpus"] = nvidia_smi_gpus()
    return versions


def _proc_field(path: Path, key: str) -> str | None:
    try:
        with path.open() as lines:
            for line in lines:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        return None
    return None


def host_info(proc: Path = Path("/proc")) -> dict[str, Any]:
    """Hostname, CPU model, logical CPU count, allowed CPUs, total memory (GiB), and the event
    loop the load's client processes run on here (resident/eventloop.py's auto)."""
    memory = _proc_field(proc / "meminfo", "MemTotal")  # "131072000 kB"
    memory_gib = None
    if memory and memory.split()[0].isdigit():
        memory_gib = round(int(memory.split()[0]) / 2**20, 1)
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _proc_field(proc / "cpuinfo", "model name"),
        "logical_cpus": os.cpu_count(),
        "allowed_cpus": format_cpu_list(os.sched_getaffinity(0)),
        "memory_gib": memory_gib,
        "client_event_loop": eventloop.resolve("auto")[0],
    }
