"""manifest.json, typed: what a session was (arms, cells, design, host, placement) and what
became of it (rounds run, why it stopped, its servers' times, its resumptions).

The manifest is read once, at the edge (`Manifest.read`), and passed as a Manifest from then on;
a session that changes it makes a new one (`dataclasses.replace`, `with_arm`, `with_server`) and
writes it (`write`). On disk it is the JSON every gate so far wrote: `to_dict` gives the same
keys a session of its kind always wrote, and `from_dict` reads manifests of older gates (a
field they lack takes its default; `sessions` is the old name of `rounds`; keys this gate does
not know are dropped). A check's manifest has no rounds or cells: its `to_dict` leaves them out.
Nested records that describe other programs (placement, host, versions, an arm's
/debug/config, the check's options) stay mappings.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class ArmEntry:
    """An arm as the session ran it: its spec, tree and commit, knobs, and what its servers
    reported (`debug_config`: the last /debug/config; `planner_off`: it asked for resident
    planning and did not get it)."""

    name: str
    spec: str = ""
    kind: str = "resident"
    tree: str | None = None
    ref: str | None = None
    sha: str | None = None
    dirty: bool = False
    command: str | None = None
    knobs: dict[str, str] = field(default_factory=dict)
    planner_off: bool = False
    debug_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an arm entry needs a name")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArmEntry:
        return cls(**_known(cls, data))

    @property
    def source_digest(self) -> str | None:
        """The package source digest its servers reported (None before one did)."""
        return (self.debug_config or {}).get("source_digest")


@dataclass(frozen=True)
class ServerTiming:
    """One server the session launched: its round (0-based) or a check's `launch`, when it was
    launched (the epoch), launch to its first /health 200 (None: never), its stop, and for a
    resident server where its start went (`startup`) and the compile caches it used."""

    round: int
    arm: str
    launched_at: float | None = None
    health_s: float | None = None
    stop_s: float | None = None
    startup: dict[str, float] | None = None
    caches: dict[str, str | None] | None = None
    launch: str | None = None

    def to_dict(self) -> dict[str, Any]:
        entry = dataclasses.asdict(self)
        if entry["launch"] is None:
            del entry["launch"]
        return entry


@dataclass(frozen=True)
class Timing:
    """Where a session's time went: its wall time over every invocation, and its servers."""

    wall_s: float = 0.0
    servers: tuple[ServerTiming, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timing:
        return cls(wall_s=data.get("wall_s") or 0.0,
                   servers=tuple(ServerTiming(**_known(ServerTiming, s))
                                 for s in data.get("servers") or ()))

    def to_dict(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "servers": [s.to_dict() for s in self.servers]}


@dataclass(frozen=True)
class Stop:
    """Why a session stopped, after how many rounds."""

    after_rounds: int
    reason: str


@dataclass(frozen=True)
class Resumption:
    """One `--resume` of the session: when, from which round (0-based), by which command, on
    which host and versions."""

    at: str
    from_round: int
    command: tuple[str, ...] = ()
    host: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    removed_env: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostLoad:
    """The host's load averages (1, 5, 15 minutes) and its online CPUs around one round: a
    reading before the round's first server starts and one after its last stops."""

    round: int
    before: tuple[float, float, float]
    after: tuple[float, float, float]
    cpus: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostLoad:
        return cls(round=data["round"], before=tuple(data["before"]),
                   after=tuple(data["after"]), cpus=data["cpus"])


# what a `run` (or `phases`) manifest always holds and a check's never does
RUN_KEYS = ("aa_arm", "cells", "prompt_len", "shared_prefix_len", "output_len", "rounds",
            "until_verdict", "max_rounds", "min_effect", "rounds_run", "runs", "interleave",
            "parallel_start", "requests", "seed", "profile", "sampling", "request_rate")
# written only where set
OPTIONAL_KEYS = ("timing", "stopped", "resumed", "command_kind", "yardstick", "check",
                 "prompts", "host_load")
# keys of older manifests -> their field now
RENAMED = {"sessions": "rounds"}


@dataclass(frozen=True)
class Manifest:
    """A session's manifest.json (see the module docstring)."""

    name: str = ""
    command: tuple[str, ...] = ()
    created: str = ""
    baseline: str | None = None
    arms: tuple[ArmEntry, ...] = ()
    model: str | None = None
    device: str | None = None
    placement: dict[str, Any] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    removed_env: tuple[str, ...] = ()
    # a run's (and phases') design
    aa_arm: str | None = None
    cells: tuple[int, ...] = ()
    prompt_len: int | None = None
    shared_prefix_len: int = 0  # the one prefix every prompt opened with (--shared-prefix-len)
    output_len: int | None = None
    rounds: int | None = None  # the most rounds planned: --rounds, or --max-rounds
    until_verdict: bool = False
    max_rounds: int | None = None
    min_effect: float | None = None  # None: the rule's default (older sessions)
    rounds_run: int | None = None
    runs: int | None = None
    interleave: bool = False
    parallel_start: bool = False
    requests: dict[str, int] = field(default_factory=dict)  # "c=N" -> requests a run
    seed: int | None = None
    profile: dict[str, Any] | None = None  # the profiler and its steps, with --profile
    # the requests' temperature, top_p and top_k; None: an older session's, greedy
    sampling: dict[str, Any] | None = None
    # "c=N" -> the open loop's requests a second (--request-rate); None: a closed loop
    request_rate: dict[str, float] | None = None
    # what became of it
    timing: Timing | None = None
    stopped: Stop | None = None
    resumed: tuple[Resumption, ...] = ()
    host_load: tuple[HostLoad, ...] = ()
    # phases and check
    command_kind: str | None = None  # None: a run; "phases" or "check"
    yardstick: str | None = None
    check: dict[str, Any] | None = None
    prompts: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"manifest: arm names must differ, got {', '.join(names)}")
        if self.command_kind not in (None, "phases", "check"):
            raise ValueError(f"manifest: unknown command_kind {self.command_kind!r}")

    # -- reading ---------------------------------------------------------------------------

    @property
    def arm_names(self) -> list[str]:
        return [arm.name for arm in self.arms]

    def arm(self, name: str) -> ArmEntry:
        """The entry of the arm called `name` (KeyError if the session had none)."""
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(f"manifest has no arm {name!r}")

    @property
    def planner_off_arms(self) -> set[str]:
        """Arms the manifest flags planner_off."""
        return {arm.name for arm in self.arms if arm.planner_off}

    # -- changing --------------------------------------------------------------------------

    def with_arm(self, name: str, **changes: Any) -> Manifest:
        """This manifest with the entry of arm `name` changed."""
        self.arm(name)
        arms = tuple(dataclasses.replace(a, **changes) if a.name == name else a
                     for a in self.arms)
        return dataclasses.replace(self, arms=arms)

    def with_server(self, server: ServerTiming) -> Manifest:
        """This manifest with one more server in its timing."""
        timing = self.timing or Timing()
        return dataclasses.replace(self, timing=dataclasses.replace(
            timing, servers=(*timing.servers, server)))

    def with_wall(self, wall_s: float) -> Manifest:
        """This manifest with the session's wall time so far."""
        return dataclasses.replace(self, timing=dataclasses.replace(
            self.timing or Timing(), wall_s=wall_s))

    # -- JSON ------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        data = {RENAMED.get(key, key): value for key, value in data.items()}
        values = _known(cls, data)
        values["arms"] = tuple(ArmEntry.from_dict(a) for a in data.get("arms") or ())
        for key in ("command", "removed_env", "cells"):
            values[key] = tuple(data.get(key) or ())
        if data.get("timing"):
            values["timing"] = Timing.from_dict(data["timing"])
        if data.get("stopped") is not None:
            values["stopped"] = Stop(**_known(Stop, data["stopped"]))
        values["resumed"] = tuple(
            Resumption(**{**_known(Resumption, r), "command": tuple(r.get("command") or ()),
                          "removed_env": tuple(r.get("removed_env") or ())})
            for r in data.get("resumed") or ())
        values["host_load"] = tuple(HostLoad.from_dict(h) for h in data.get("host_load") or ())
        for key in ("placement", "host", "versions", "requests"):
            values[key] = data.get(key) or {}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON values, with the keys a session of its kind writes."""
        data = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
        if self.command_kind == "check":
            for key in RUN_KEYS:
                del data[key]
        for key in OPTIONAL_KEYS:
            if data[key] in (None, []):
                del data[key]
        return data

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        """The manifest in a session's directory."""
        path = directory / MANIFEST_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{directory} has no {MANIFEST_FILE}")
        return cls.from_dict(json.loads(path.read_text()))

    def write(self, directory: Path) -> None:
        write_manifest_json(directory, self.to_dict())


def write_manifest_json(directory: Path, data: dict[str, Any]) -> None:
    """manifest.json as every gate wrote it: indented, keys sorted."""
    (directory / MANIFEST_FILE).write_text(json.dumps(data, indent=2, sort_keys=True,
                                                      default=str))


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def _plain(value: Any) -> Any:
    """A field's value as JSON values: dataclasses as mappings, tuples as lists."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return value
