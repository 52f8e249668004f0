"""`resident-gate phases`: where each arm's step time goes, per cell, by the engine's own phase
timing (GET /debug/phases; resident/engine/phases.py).

One server per arm, started with `phase_timing=on` and placed as `run` places it; per cell a
warm-up load, then POST /debug/phases/reset, a steady load of the cell's requests, and GET
/debug/phases. Writes phases.json (every step kind's phases per cell and arm) and phases.md with
two tables for decode steps: the plan thread's CPU by phase per arm and cell, and
"plan thread baseline -> arm (ms), arm takes, of the baseline's step". The manifest records the
session as `run` does, with `"command_kind": "phases"`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from gate.report.markdown import TableSpec, header_line, page_title
from gate.run.load import run_load
from gate.run.measure import warmed_load
from gate.run.server import ServerFailed
from gate.run.session import LiveServer, Session

PHASES_JSON, PHASES_MD = "phases.json", "phases.md"
# GET /debug/phases keys, in the tables' column order
COLUMNS = ("step", "event_sync", "main", "gpu", "plan", "kv_plan", "kv_stage", "attention",
           "gdn_linear", "positions", "resident", "sampler", "declare_admit_pad", "rest")


class PhasesSession(Session):
    """A one-round Session whose cells read /debug/phases instead of recording runs: one
    server at a time (its `_cell` measures the server alone; an interleaved round has none)."""

    def __post_init__(self) -> None:
        self.config = dataclasses.replace(self.config, rounds=1, runs=1, interleave=False,
                                          parallel_start=False)
        super().__post_init__()
        self.arms = [dataclasses.replace(a, knobs={**a.knobs, "phase_timing": "on"})
                     if a.kind == "resident" else a for a in self.arms]
        self.results: dict[str, dict[str, Any]] = {}  # "c=N" -> arm -> measurement

    def run(self, resume: bool = False) -> int:
        if resume:
            raise ValueError("--resume: a phases session runs in one go")
        if (self.out / PHASES_JSON).exists():
            raise ValueError(f"--out {self.out} already holds a phases session; choose "
                             f"another --out")
        failed = super().run()
        self.manifest["command_kind"] = "phases"
        self._save_manifest()
        write_phases(self.out, self.results, self.manifest)
        return failed

    async def _cell(self, live: LiveServer, concurrency: int) -> int:
        server, arm = live.server, live.arm
        spec = await warmed_load(server, self.config, concurrency, live.vocab, live.round_index,
                                 len(self.placement.client_cpus))
        if await server.post_json("/debug/phases/reset") is None:
            raise ServerFailed(f"{arm.name}: POST /debug/phases/reset failed (not a resident "
                               f"server with /debug/phases?)", server.log_tail())
        metrics = (await run_load(server.url, spec)).metrics
        report = await server.get_json("/debug/phases") or {}
        self.results.setdefault(f"c={concurrency}", {})[arm.name] = {
            "kinds": report.get("kinds", {}), "enabled": report.get("enabled", False),
            "output_throughput": metrics.output_throughput, "failed": metrics.failed,
            "planner_off": live.planner_off}
        self.console.log(f"{arm.name} c={concurrency}: {metrics.output_throughput} tok/s, "
                         f"{report.get('kinds', {}).get('decode', {}).get('steps', 0)} "
                         f"decode steps timed")
        return int(metrics.completed == 0)


def _decode(results: dict[str, dict[str, Any]], cell: str, arm: str) -> dict[str, float] | None:
    return results.get(cell, {}).get(arm, {}).get("kinds", {}).get("decode")


def phase_rows(results: dict[str, dict[str, Any]], arms: list[str]) -> list[list[str]]:
    """The first table: one row per cell and arm, ms per decode step of each phase."""
    rows = []
    for cell in results:
        for arm in arms:
            decode = _decode(results, cell, arm)
            numbers = [f"{decode[k]:.3f}" for k in COLUMNS] if decode else ["-"] * len(COLUMNS)
            rows.append([cell, arm, *numbers, str(decode["steps"]) if decode else "0"])
    return rows


def takes_rows(results: dict[str, dict[str, Any]], arms: list[str]) -> list[list[str]]:
    """The second table: per cell and arm, the plan thread's CPU against the baseline's, what
    the arm takes off it, and that as a share of the baseline's step."""
    rows = []
    for cell in results:
        base = _decode(results, cell, arms[0])
        for arm in arms[1:]:
            head = _decode(results, cell, arm)
            if not base or not head or not base["plan"] or not base["step"]:
                rows.append([cell, arm, "-", "-", "-"])
                continue
            takes = base["plan"] - head["plan"]
            rows.append([cell, arm, f"{base['plan']:.3f} -> {head['plan']:.3f}",
                         f"{takes:.3f} ({takes / base['plan']:.0%})",
                         f"{takes / base['step']:.1%}"])
    return rows


def phase_tables(results: dict[str, dict[str, Any]], arms: list[str]) -> list[TableSpec]:
    """The two tables: the plan thread's CPU by phase per arm and cell, and what each
    arm takes off the baseline's (arms[0]) plan thread."""
    baseline = arms[0]
    return [
        TableSpec("Plan thread CPU by phase", ["cell", "arm", *COLUMNS, "steps"],
                  phase_rows(results, arms), "ll" + "r" * (len(COLUMNS) + 1)),
        TableSpec(f"The plan thread, {baseline} against each arm",
                  ["cell", "arm", f"plan thread {baseline} -> arm (ms)", "arm takes",
                   f"of {baseline}'s step"], takes_rows(results, arms), "llrrr"),
    ]


def phases_md(results: dict[str, dict[str, Any]], manifest: dict[str, Any]) -> str:
    tables = phase_tables(results, [a["name"] for a in manifest["arms"]])
    return "\n\n".join([
        page_title(manifest, "phases"), header_line(manifest),
        "ms per decode step, phase timing on, one server per arm, a steady load per cell after "
        "a warm-up and a reset. `step` and `event_sync` are wall time; the rest is thread CPU "
        "time. `plan` is the sum of the parts right of it (resident/engine/phases.py says what "
        "each part holds). Every step kind is in phases.json.",
        *(table.md() for table in tables)]) + "\n"


def write_phases(out: Path, results: dict[str, dict[str, Any]],
                 manifest: dict[str, Any]) -> None:
    (out / PHASES_JSON).write_text(json.dumps({"cells": results}, indent=2) + "\n")
    (out / PHASES_MD).write_text(phases_md(results, manifest))
