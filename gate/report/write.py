"""A finished session's report files, rebuilt from its records (runs.jsonl, manifest.json,
profiles.jsonl): what `resident-gate run` writes at its end and `resident-gate report` again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gate.manifest import Manifest
from gate.records import read_profiles, read_runs
from gate.report import plots
from gate.report.paired import PAIRED_FILE, paired_md
from gate.report.profile import PROFILE_FILE, render_profile_md
from gate.report.rounds import ROUNDS_FILE, rounds_md
from gate.report.summary import SUMMARY_FILE, SUMMARY_JSON, summary_json, summary_md, summary_rows
from gate.verdict import stats

REPORT_FILES = (ROUNDS_FILE, SUMMARY_FILE, SUMMARY_JSON, PAIRED_FILE, plots.TOK_S_FILE,
                plots.ITL_FILE)


def write_reports(directory: Path) -> list[dict[str, Any]]:
    """Rebuild REPORT_FILES (rounds.md, summary.md, summary.json, paired.md and the plots) in
    `directory`, and profile.md when the session profiled.

    Reads runs.jsonl and manifest.json there; returns the summary rows.
    """
    manifest = Manifest.read(directory)
    frame = stats.runs_frame(read_runs(directory), stats.measure_of(manifest))
    baseline = manifest.baseline
    slots = stats.by_slot(manifest)
    paired = stats.paired_deltas(frame, baseline, slots)
    verdicts = stats.verdicts(frame, baseline, manifest.aa_arm, stats.design_of(manifest), slots)
    rows = summary_rows(frame, manifest, verdicts)
    (directory / ROUNDS_FILE).write_text(rounds_md(frame, manifest))
    (directory / SUMMARY_FILE).write_text(summary_md(rows, manifest))
    (directory / SUMMARY_JSON).write_text(json.dumps(summary_json(rows, manifest), indent=2)
                                          + "\n")
    flagged = stats.planner_off_arms(frame, manifest)
    (directory / PAIRED_FILE).write_text(paired_md(paired, verdicts, manifest, flagged))
    plots.plot_tok_s(frame, manifest, directory / plots.TOK_S_FILE)
    plots.plot_itl(frame, manifest, directory / plots.ITL_FILE)
    profiles = read_profiles(directory)
    if profiles:
        (directory / PROFILE_FILE).write_text(render_profile_md(manifest, profiles))
    return rows
