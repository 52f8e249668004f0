"""The host's CPU topology as sysfs gives it: each allowed CPU's core, package and hyperthread
siblings, the CPUs local to a GPU, and CPU lists written as "0-3,8" (gate/run/placement.py
places the servers and the client on them)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from resident.config import parse_cpu_list

SYSFS_CPU = Path("/sys/devices/system/cpu")
PCI_DEVICES = Path("/sys/bus/pci/devices")


@dataclass(frozen=True)
class CpuInfo:
    """One logical CPU: its physical core and package, and its hyperthread siblings (itself too)."""

    cpu: int
    core: int
    package: int
    siblings: tuple[int, ...]


def format_cpu_list(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8] -> "0-3,8"; empty -> ""."""
    ordered = sorted(set(cpus))
    runs: list[list[int]] = []
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


def allowed_cpus() -> set[int]:
    """The CPUs this process may run on."""
    return set(os.sched_getaffinity(0))


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_cpus(path: Path) -> list[int] | None:
    try:
        return parse_cpu_list(path.read_text().strip(), str(path))
    except (OSError, ValueError):
        return None


def read_topology(sysfs: Path = SYSFS_CPU,
                  allowed: Iterable[int] | None = None) -> list[CpuInfo]:
    """Core, package and siblings of every allowed CPU (default: this process's affinity).

    Missing topology files (containers often hide them) make each CPU its own core on package 0.
    """
    cpus = sorted(allowed_cpus() if allowed is None else set(allowed))
    raw = {}
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        core = _read_int(topology / "core_id")
        package = _read_int(topology / "physical_package_id")
        raw[cpu] = (cpu if core is None else core, package or 0, core is None,
                    _read_cpus(topology / "thread_siblings_list"))
    by_core: dict[tuple[int, int], list[int]] = {}
    for cpu, (core, package, guessed, _) in raw.items():
        if not guessed:
            by_core.setdefault((package, core), []).append(cpu)
    infos = []
    for cpu, (core, package, guessed, siblings) in raw.items():
        if siblings is None:
            siblings = [cpu] if guessed else by_core[(package, core)]
        infos.append(CpuInfo(cpu, core, package, tuple(sorted(set(siblings) | {cpu}))))
    return infos


def read_local_cpus(pci_bus_id: str, pci_root: Path = PCI_DEVICES) -> set[int] | None:
    """The CPUs local to a PCI device ("00000000:18:00.0"), from its sysfs `local_cpulist`."""
    domain, _, rest = pci_bus_id.strip().lower().partition(":")
    name = f"{domain[-4:]}:{rest}" if rest else domain
    cpus = _read_cpus(pci_root / name / "local_cpulist")
    return set(cpus) if cpus else None


def gpu_local_cpus(gpu: int, pci_root: Path = PCI_DEVICES) -> set[int] | None:
    """The CPUs local to GPU `gpu` (NVML index); None without NVML or sysfs."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        bus_id = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu)).busId
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()
    return read_local_cpus(bus_id.decode() if isinstance(bus_id, bytes) else bus_id, pci_root)
