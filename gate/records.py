"""What a gate session writes: one RunRecord a line in runs.jsonl, profiles.jsonl, and
manifest.json (gate/manifest.py): the one contract between running a session and reporting it.

runs.jsonl is appended as each run finishes, so an interrupted session keeps what it measured;
`resident-gate report` rebuilds every table and plot from it and the manifest alone.

A session is one `resident-gate run` (its output directory); it runs rounds, and in each round
every arm's server starts once and serves all the cells' runs. A run is one arm serving one cell
(a concurrency) once: `round` is the round (0-based; each round has its own Inductor cache and
its own prompt seed), `position` the arm's place in that round's order (arms rotate: ABBA for
two), `run` the run's number within the cell and round (1-based). Its numbers are `metrics`, a
ServeMetrics (gate/metrics.py: vLLM's names for them). A run that could not be measured (its
server failed to start or died) has ok=False, its error, its server's log tail and no metrics.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gate.metrics import ServeMetrics

RUNS_FILE = "runs.jsonl"
PROFILES_FILE = "profiles.jsonl"  # one profile window a line (gate/run/profiling.py)
PHASES_JSON = "phases.json"  # a phases session's measurements (gate/run/phases.py)


@dataclass(frozen=True)
class GpuSample:
    """NVML readings over a run: medians, and the hottest temperature."""

    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    utilization_pct: float | None = None
    power_w: float | None = None
    temperature_c_max: float | None = None


@dataclass(frozen=True)
class RunRecord:
    round: int
    arm: str
    position: int
    concurrency: int
    run: int
    ok: bool
    error: str | None = None  # why it failed, or why its failed requests did (the first five)
    metrics: ServeMetrics | None = None
    steps: dict[str, int] = field(default_factory=dict)  # server steps by kind over the run
    # the server's mean wall ms inside a step of each kind over the run (resident's /metrics)
    step_ms: dict[str, float] = field(default_factory=dict)
    # the prefix cache over the run (resident's /metrics; empty for other servers): `hits`,
    # requests that started from a cached prefix, and `saved_tokens`, prompt tokens restored
    prefix: dict[str, int] = field(default_factory=dict)
    # the server's mean `queue`, `prefill` and `ttft` ms (API arrival to the first token out of
    # the engine core) over the requests whose first token left it during the run (resident's
    # /metrics; empty for other servers): TTFT at the client less `ttft` here is the request's
    # way in and its first token's way out
    core_ms: dict[str, float] = field(default_factory=dict)
    # requests late launch's windows took into the step after the running one over the run
    # (resident's /metrics, late_launch); None: a server without the counter
    window_arrivals: int | None = None
    # seconds the engine core's garbage collector paused it over the run, every generation
    # (resident's /metrics); None: a server without the counters
    core_gc_s: float | None = None
    sibling_busy_cpus: float | None = None  # None: n/a (masks overlap or no /proc/stat)
    # CPU seconds over the run of the launched server process (a resident arm's API process)
    # and of its descendants (the engine core); None: n/a (no /proc)
    api_cpu_s: float | None = None
    core_cpu_s: float | None = None
    # CPU seconds of the load's client while it sent the measured requests: the gate's event
    # loop thread with one client, the sum over its `num_clients` processes with more
    # (records before 2026-12-04 18:00 UTC counted the gate's whole process and the clients' lives)
    client_cpu_s: float | None = None
    num_clients: int = 1
    # open loop (--request-rate): measured requests that arrived with every slot busy and
    # waited for one
    num_waited: int = 0
    gpu: GpuSample | None = None
    server_tracebacks: int = 0  # in the arm's server log so far
    recompile_limit_lines: int = 0
    # the arm asked for resident_planning=auto and did not get it (a manifest arm's planner_off
    # means the same)
    planner_off: bool = False
    log_tail: str | None = None  # the server log's end, for runs that failed
    started_at: float = 0.0  # unix time

    @property
    def cell(self) -> str:
        return f"c={self.concurrency}"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """Keys this version does not know (a newer gate wrote them) are dropped. Older records
        hold the round as `session` and their numbers flat (_legacy_metrics)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"gpu", "metrics"}
        data = {_RENAMED.get(key, key): value for key, value in data.items()}
        gpu, metrics = data.get("gpu"), data.get("metrics")
        metrics = ServeMetrics(**metrics) if metrics else _legacy_metrics(data)
        return cls(**{k: v for k, v in data.items() if k in known},
                   gpu=GpuSample(**gpu) if gpu else None, metrics=metrics)


# keys of older runs.jsonl records -> their field now
_RENAMED = {"session": "round"}


def _legacy_metrics(data: dict[str, Any]) -> ServeMetrics | None:
    """The numbers of a record written before ServeMetrics, which held tok/s, ITL p50 and mean,
    TTFT p50, request and token counts and the wall time flat; None where it measured nothing."""
    if not data.get("num_requests") or data.get("wall_s") is None:
        return None
    completed = data["num_requests"] - data.get("num_failed", 0)
    wall = data["wall_s"]
    return ServeMetrics(
        max_concurrency=data["concurrency"], duration=wall, completed=completed,
        failed=data.get("num_failed", 0), total_input_tokens=None,
        total_output_tokens=data.get("output_tokens", 0),
        request_throughput=round(completed / wall, 3) if wall > 0 else None,
        output_throughput=data.get("output_tok_s"), median_itl_ms=data.get("itl_p50_ms"),
        mean_itl_ms=data.get("itl_mean_ms"), median_ttft_ms=data.get("ttft_p50_ms"))


def append_run(directory: Path, record: RunRecord) -> None:
    with (directory / RUNS_FILE).open("a") as out:
        out.write(record.to_json() + "\n")
        out.flush()


def rewrite_runs(directory: Path, records: list[RunRecord]) -> None:
    """Replaces runs.jsonl with these records (a resumed session drops a partial round)."""
    path = directory / RUNS_FILE
    temporary = path.with_suffix(".tmp")
    temporary.write_text("".join(record.to_json() + "\n" for record in records))
    temporary.replace(path)


def read_runs(directory: Path) -> list[RunRecord]:
    path = directory / RUNS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} has no {RUNS_FILE}")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for index, line in enumerate(lines):
        try:
            records.append(RunRecord.from_dict(json.loads(line)))
        except json.JSONDecodeError:
            if index == len(lines) - 1:  # a session killed mid-write: keep what it measured
                break
            raise
    return records


def append_profile(out: Path, record: dict[str, Any]) -> None:
    with (out / PROFILES_FILE).open("a") as file:
        file.write(json.dumps(record) + "\n")


def read_profiles(out: Path) -> list[dict[str, Any]]:
    path = out / PROFILES_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
