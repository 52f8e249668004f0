"""Placement: which CPUs the gate's server processes and its load client run on.

From the host topology (sysfs), the way an A/B benchmark is pinned by hand: the load client gets
whole physical cores of its own (hyperthread siblings never split between server and client), the
server keeps to one package (the GPU's, when known), its API process takes the first server CPU
and the engine core's step threads the rest. Hosts with fewer than 4 CPUs (or one physical core)
cannot give the client cores of its own: there the step threads take every CPU but the first,
which the API process and the client share (`overlap`; one CPU is shared by everything). Every
decision is written to `notes`. Options given on the command line override the defaults and are
checked against the process's allowed CPUs and each other.

CPU lists use `resident.config.parse_cpu_list`'s syntax: "0-3,8".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from gate.run.topology import CpuInfo, format_cpu_list, read_topology
from resident.config import parse_cpu_list

MIN_SPLIT_CPUS = 4
CLIENT_SHARE = 0.25


@dataclass(frozen=True)
class Placement:
    """CPU masks for the server (API core, step cores) and the load client, and the GPU."""

    server_cpus: tuple[int, ...]
    step_cores: tuple[int, ...]
    api_core: int | None
    client_cpus: tuple[int, ...]
    gpu: int | None
    overlap: bool
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: lists of CPUs, plus each mask in CPU-list syntax."""
        data = {key: list(value) if isinstance(value, tuple) else value
                for key, value in asdict(self).items()}
        data["masks"] = {"server": format_cpu_list(self.server_cpus),
                         "step": format_cpu_list(self.step_cores),
                         "client": format_cpu_list(self.client_cpus)}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Placement:
        """Inverse of to_dict (as read back from a manifest)."""
        fields = ("server_cpus", "step_cores", "client_cpus", "notes")
        return cls(**{key: tuple(data[key]) for key in fields},
                   api_core=data.get("api_core"), gpu=data.get("gpu"),
                   overlap=bool(data["overlap"]))

    def server_knobs(self) -> dict[str, str]:
        """The server's pinning knobs (`api_core`, `step_thread_cores`); unset ones left out."""
        knobs = {"api_core": "" if self.api_core is None else str(self.api_core),
                 "step_thread_cores": format_cpu_list(self.step_cores)}
        return {knob: value for knob, value in knobs.items() if value}


@dataclass(frozen=True)
class PlacementOverrides:
    """What the user set on the command line; None: take the default."""

    server_cpus: tuple[int, ...] | None = None
    step_cores: tuple[int, ...] | None = None
    api_core: int | None = None
    client_cpus: tuple[int, ...] | None = None
    gpu: int | None = None

    def given(self) -> list[str]:
        """The options set, as `--option value`."""
        values = {"--server-cpus": self.server_cpus, "--step-cores": self.step_cores,
                  "--api-core": self.api_core, "--client-cpus": self.client_cpus,
                  "--gpu": self.gpu}
        return [f"{option} {_show(value)}" for option, value in values.items()
                if value is not None]


def _show(value: int | tuple[int, ...]) -> str:
    return str(value) if isinstance(value, int) else format_cpu_list(value)


def _core_groups(cpus: list[CpuInfo]) -> list[tuple[int, tuple[int, ...]]]:
    """(package, CPUs) per physical core, hyperthread siblings together, in CPU order."""
    allowed = {info.cpu for info in cpus}
    taken: set[int] = set()
    groups = []
    for info in sorted(cpus, key=lambda info: info.cpu):
        if info.cpu in taken:
            continue
        group = tuple(sorted((set(info.siblings) & allowed | {info.cpu}) - taken))
        taken.update(group)
        groups.append((info.package, group))
    return groups


def _server_package(groups: list[tuple[int, tuple[int, ...]]],
                    local_cpus: set[int] | None) -> tuple[int, str]:
    counts: dict[int, int] = {}
    local: dict[int, int] = {}
    for package, group in groups:
        counts[package] = counts.get(package, 0) + 1
        local[package] = local.get(package, 0) + bool(local_cpus and set(group) & local_cpus)
    if any(local.values()):
        return max(counts, key=lambda p: (local[p], counts[p], -p)), "local to the GPU"
    return max(counts, key=lambda p: (counts[p], -p)), "the most allowed cores"


def _sibling_note(groups: list[tuple[int, tuple[int, ...]]]) -> str:
    if any(len(group) > 1 for _, group in groups):
        return "hyperthread siblings kept together"
    return "no hyperthread siblings seen"


def _small(cpus: list[CpuInfo], gpu: int | None, why: str) -> Placement:
    """A host too small for the client to have cores of its own: the step threads alone on
    every CPU but the first, the API process and the client on the first, so an engine core
    keeps its CPU and its caches. On this project's 2-CPU VM one interleaved demo session
    unpinned read its c=4 rounds 6.9% apart, the next one pinned 1.8% (one session each; later
    sessions pinned spread 2-8%: results/2026-12-02-cpu-demo-interleave)."""
    every = tuple(sorted(info.cpu for info in cpus))
    if len(every) < 2:
        note = f"{why}: server and client share CPU {format_cpu_list(every)}, server unsplit"
        return Placement(every, (), None, every, gpu, True, (note,))
    api, step = split_server(every)
    note = (f"{why}: step threads alone on CPUs {format_cpu_list(step)}, the API process and "
            f"the client share CPU {api}")
    return Placement(every, step, api, (api,), gpu, True, (note,))


def split_server(server: tuple[int, ...]) -> tuple[int | None, tuple[int, ...]]:
    """(API core, step cores): the first server CPU and the rest; one CPU: nothing pinned."""
    if len(server) < 2:
        return None, ()
    return server[0], server[1:]


def default_placement(cpus: list[CpuInfo], gpu: int | None,
                      local_cpus: Iterable[int] | None = None) -> Placement:
    """The placement for this topology: client on the last ~25% of physical cores, server apart.

    `local_cpus` (the GPU's NUMA-local CPUs, e.g. `gpu_local_cpus`) picks the server's package
    on a multi-package host; without it the package with the most allowed cores wins.
    """
    groups = _core_groups(cpus)
    if len(cpus) < MIN_SPLIT_CPUS:
        return _small(cpus, gpu, f"fewer than {MIN_SPLIT_CPUS} CPUs ({len(cpus)})")
    if len(groups) < 2:
        return _small(cpus, gpu, "one physical core")
    local = set(local_cpus) if local_cpus is not None else None
    package, why = _server_package(groups, local)
    ordered = sorted(groups, key=lambda g: (g[0] != package, g[0], g[1][0]))
    num_client = max(1, int(len(groups) * CLIENT_SHARE + 0.5))
    client = tuple(sorted(cpu for _, group in ordered[-num_client:] for cpu in group))
    server = tuple(sorted(cpu for p, group in ordered[:-num_client] if p == package
                          for cpu in group))
    api, step = split_server(server)
    notes = [f"server on CPUs {format_cpu_list(server)}: API on CPU {api}, step threads on "
             f"{format_cpu_list(step)}",
             f"client on CPUs {format_cpu_list(client)}: {num_client} of {len(groups)} "
             f"physical cores, {_sibling_note(groups)}"]
    packages = {p for p, _ in groups}
    if len(packages) > 1:
        notes.append(f"{len(packages)} packages: server kept on package {package} ({why})")
    idle = {info.cpu for info in cpus} - set(server) - set(client)
    if idle:
        notes.append(f"CPUs {format_cpu_list(idle)} left to neither (sibling busy CPUs)")
    return Placement(server, step, api, client, gpu, False, tuple(notes))


def _parse_option(option: str, text: str | None, allowed: set[int]) -> tuple[int, ...] | None:
    if text is None or not text.strip():
        return None
    try:
        cpus = parse_cpu_list(text, option)
    except ValueError:
        raise ValueError(f"{option} {text}: not a CPU list like 0-3,8") from None
    if not cpus:
        raise ValueError(f"{option} {text}: names no CPU")
    outside = sorted(set(cpus) - allowed)
    if outside:
        raise ValueError(f"{option} {text}: CPU {format_cpu_list(outside)} is not allowed for "
                         f"this process (allowed: {format_cpu_list(allowed)})")
    return tuple(sorted(set(cpus)))


def _parse_gpu(text: str | None) -> int | None:
    if text is None or not text.strip():
        return None
    try:
        gpu = int(text)
    except ValueError:
        raise ValueError(f"--gpu {text}: not a GPU index") from None
    if gpu < 0:
        raise ValueError(f"--gpu {text}: not a GPU index")
    return gpu


def parse_placement(server_cpus: str | None, step_cores: str | None, api_core: str | None,
                    client_cpus: str | None, gpu: str | None,
                    allowed: set[int]) -> PlacementOverrides:
    """The user's placement options, parsed and checked against the allowed CPUs.

    None or "" leaves an option at its default. Raises ValueError naming the option and its
    value.
    """
    api = _parse_option("--api-core", api_core, allowed)
    if api is not None and len(api) != 1:
        raise ValueError(f"--api-core {api_core}: give one CPU")
    return PlacementOverrides(
        server_cpus=_parse_option("--server-cpus", server_cpus, allowed),
        step_cores=_parse_option("--step-cores", step_cores, allowed),
        api_core=None if api is None else api[0],
        client_cpus=_parse_option("--client-cpus", client_cpus, allowed),
        gpu=_parse_gpu(gpu),
    )


def _check_within(option: str, cpus: tuple[int, ...], server: tuple[int, ...],
                  server_given: bool) -> None:
    outside = sorted(set(cpus) - set(server))
    if outside:
        where = (f"--server-cpus {format_cpu_list(server)}" if server_given
                 else f"the server CPUs {format_cpu_list(server)} (default)")
        raise ValueError(f"{option} {format_cpu_list(cpus)}: CPU {format_cpu_list(outside)} "
                         f"is not in {where}")


def _server_split(default: Placement, overrides: PlacementOverrides,
                  server: tuple[int, ...]) -> tuple[int | None, tuple[int, ...]]:
    if overrides.server_cpus is None:
        api, step = default.api_core, default.step_cores
    else:
        api, step = split_server(server)
    if overrides.api_core is not None:
        api = overrides.api_core
        step = tuple(cpu for cpu in server if cpu != api) or server
    if overrides.step_cores is not None:
        step = overrides.step_cores
    return api, step


def resolve_placement(default: Placement, overrides: PlacementOverrides) -> Placement:
    """The default placement with the user's options applied, checked, and `overlap` recomputed.

    Changing the server CPUs re-derives the API core and step cores from them unless those are
    given too. Raises ValueError when step cores or the API core fall outside the server CPUs.
    """
    given = overrides.given()
    if not given:
        return default
    server_given = overrides.server_cpus is not None
    server = overrides.server_cpus if server_given else default.server_cpus
    api, step = _server_split(default, overrides, server)
    if overrides.step_cores is not None:
        _check_within("--step-cores", step, server, server_given)
    if overrides.api_core is not None:
        _check_within("--api-core", (api,), server, server_given)
    client = overrides.client_cpus or default.client_cpus
    gpu = default.gpu if overrides.gpu is None else overrides.gpu
    shared = set(server) & set(client)
    notes = [*default.notes, "overridden: " + ", ".join(given)]
    if shared and not default.overlap:
        notes.append(f"server and client masks share CPUs {format_cpu_list(shared)}")
    return Placement(server, step, api, client, gpu, bool(shared), tuple(notes))


def host_placement(device: str, server_cpus: str | None = None, step_cores: str | None = None,
                   api_core: str | None = None, client_cpus: str | None = None,
                   gpu: str | None = None) -> Placement:
    """This host's placement (default_placement of its topology, GPU 0 on `cuda`) with the
    user's options (CPU lists and a GPU index as given, None or "" for the default) applied
    and checked. Raises ValueError naming a bad option."""
    default = default_placement(read_topology(), 0 if device == "cuda" else None)
    overrides = parse_placement(server_cpus, step_cores, api_core, client_cpus, gpu,
                                set(os.sched_getaffinity(0)))
    return resolve_placement(default, overrides)
