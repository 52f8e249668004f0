"""phases.md and phases.json: a phases session's two tables for decode steps, the plan thread's
CPU by phase per arm and cell, and "plan thread baseline -> arm (ms), arm takes, of the
baseline's step" (the session itself: gate/run/phases.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gate.manifest import Manifest
from gate.records import PHASES_JSON
from gate.report.markdown import TableSpec, header_line, page_title

PHASES_MD = "phases.md"
# GET /debug/phases keys, in the tables' column order
COLUMNS = ("step", "event_sync", "window", "main", "gpu", "plan", "kv_plan", "kv_stage",
           "attention", "gdn_linear", "positions", "resident", "sampler", "declare_admit_pad",
           "rest")


def _decode(results: dict[str, dict[str, Any]], cell: str, arm: str) -> dict[str, float] | None:
    return results.get(cell, {}).get(arm, {}).get("kinds", {}).get("decode")


def _plan(results: dict[str, dict[str, Any]], cell: str, arm: str, plan: float) -> str:
    """The merged plan thread's ms, with its rounds' range where there were several."""
    plans = [one["kinds"]["decode"]["plan"]
             for one in results[cell][arm].get("by_round", [])
             if one["kinds"].get("decode", {}).get("steps")]
    spread = f" [{min(plans):.3f}-{max(plans):.3f}]" if len(plans) > 1 else ""
    return f"{plan:.3f}{spread}"


def phase_rows(results: dict[str, dict[str, Any]], arms: list[str]) -> list[list[str]]:
    """The first table: one row per cell and arm, ms per decode step of each phase."""
    rows = []
    for cell in results:
        for arm in arms:
            decode = _decode(results, cell, arm)
            # a server before late_launch reports no window
            numbers = [f"{decode[k]:.3f}" if k in decode else "-" for k in COLUMNS] \
                if decode else ["-"] * len(COLUMNS)
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
            rows.append([cell, arm, f"{_plan(results, cell, arms[0], base['plan'])} -> "
                                    f"{_plan(results, cell, arm, head['plan'])}",
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


def phases_md(results: dict[str, dict[str, Any]], manifest: Manifest) -> str:
    tables = phase_tables(results, manifest.arm_names)
    return "\n\n".join([
        page_title(manifest, "phases"), header_line(manifest),
        "ms per decode step, phase timing on, one server per arm at a time, a steady load per "
        "cell after a warm-up and a reset; over several rounds (arms in alternated order) each "
        "number is the rounds' mean weighted by their steps, and the plan thread's rounds' "
        "range follows it in brackets. `step`, `event_sync` and `window` (late_launch's poll "
        "for arrivals) are wall time; the rest is "
        "thread CPU time. `plan` is the sum of the parts right of it (resident/engine/phases.py "
        "says what each part holds). Every step kind, and each round's, is in phases.json.",
        *(table.md() for table in tables)]) + "\n"


def write_phases(out: Path, results: dict[str, dict[str, Any]], manifest: Manifest) -> None:
    """phases.json (every step kind's phases per cell and arm) and phases.md."""
    (out / PHASES_JSON).write_text(json.dumps({"cells": results}, indent=2) + "\n")
    (out / PHASES_MD).write_text(phases_md(results, manifest))
