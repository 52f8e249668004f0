"""profile.md: where each arm's step time goes, from the profile windows of a session
(gate/run/profiling.py). Per cell: each arm's step numbers by kind, then per step kind the
kernel table of every arm side by side, and each arm's diff against the baseline with its
one-line headline. The tables read the same whichever tool recorded the windows
(resident/profiling/)."""

from __future__ import annotations

from typing import Any

from gate.manifest import Manifest
from gate.report.markdown import fmt, known, md_table, page_title
from resident.profiling.summary import KindDiff, KindSummary, ProfileSummary, diff

PROFILE_FILE = "profile.md"
KERNEL_ROWS = 25  # the costliest kernels shown a table; the diff lists every change
NAME_CHARS = 80

READING = """\
How to read this. Each arm and cell had one profile window (`steps` steps) in a steady load at
the cell's concurrency, after its timed runs: the timed runs are never profiled. Per step kind:
`period` is host start to next start (the cadence tok/s sees); `busy` the union of the step's
GPU work; `gaps` the idle between its first and last kernel (launch gaps inside a graph
included); `graph` the span of its graph replays (median) and `idle outside` the period less
it. A kernel's cell is its µs a step / its exposed µs (the part of `busy` it alone accounts
for: under PDL a kernel launches early and waits inside the one before it, so its own µs count
that wait and the kernels' µs add up to more than the step; the exposed µs add up to `busy`),
then its calls a step. Kernels are matched by name; a change counts when it exceeds 3 standard
errors of the difference (each kernel's spread over the window's steps) or its calls per step
differ. Open a trace (`profiles/*.json.gz`) in https://ui.perfetto.dev or chrome://tracing;
an nsys report in Nsight Systems."""


def render_profile_md(manifest: Manifest, records: list[dict[str, Any]]) -> str:
    """records: profiles.jsonl's lines ({"round", "arm", "concurrency", "tool", "trace",
    "summary", "error"})."""
    tool = manifest.profile or {}
    lines = [page_title(manifest, "profiles"), "",
             f"Tool: {tool.get('tool', '?')} ({tool.get('why', '')}). "
             f"Baseline {known(manifest.baseline)}.", "", READING, ""]
    arms = manifest.arm_names
    for cell in sorted({r["concurrency"] for r in records}):
        cell_records = {r["arm"]: r for r in records if r["concurrency"] == cell}
        lines += [f"## c={cell}", ""]
        lines += _cell(cell_records, [a for a in arms if a in cell_records])
    return "\n".join(lines).rstrip() + "\n"


def _cell(records: dict[str, dict], arms: list[str]) -> list[str]:
    failed = [f"- {arm}: {records[arm]['error']}" for arm in arms if records[arm].get("error")]
    summaries = {arm: ProfileSummary.from_dict(records[arm]["summary"]) for arm in arms
                 if records[arm].get("summary")}
    lines = (["Profiles that failed:", "", *failed, ""] if failed else [])
    if not summaries:
        return lines
    lines += ["### Steps", "", _steps_table(summaries), ""]
    baseline = arms[0] if arms[0] in summaries else None
    for kind in sorted({k.kind for s in summaries.values() for k in s.kinds}):
        by_arm = {arm: s.kind(kind) for arm, s in summaries.items() if s.kind(kind)}
        lines += [f"### {kind} kernels (µs a step / exposed µs, calls a step)", "",
                  _kernel_table(by_arm), ""]
        for arm in by_arm:
            if baseline in by_arm and arm != baseline:
                lines += _diff_lines(arm, diff(by_arm[baseline], by_arm[arm]))
    return lines


def _steps_table(summaries: dict[str, ProfileSummary]) -> str:
    header = ["arm", "kind", "steps", "period µs mean/median", "busy µs", "busy %", "gaps µs",
              "graph µs", "idle outside µs", "kernels/step"]
    rows = []
    for arm, summary in summaries.items():
        for k in summary.kinds:
            share = k.busy_share
            rows.append([arm, k.kind, str(k.steps),
                         f"{fmt(k.period_us_mean, 0)}/{fmt(k.period_us_median, 0)}",
                         fmt(k.busy_us, 0), fmt(None if share is None else share * 100, 0),
                         fmt(k.gaps_us, 1), fmt(k.graph_us_median, 0),
                         fmt(k.idle_outside_graph_us, 0), fmt(k.ops_per_step, 1)])
    return md_table(header, rows, "llrrrrrrrr")


def _kernel_table(by_arm: dict[str, KindSummary]) -> str:
    arms = list(by_arm)
    tables = {arm: {k.name: k for k in s.kernels} for arm, s in by_arm.items()}
    cost = {name: max(t[name].us_per_step for t in tables.values() if name in t)
            for t in tables.values() for name in t}
    names = sorted(cost, key=lambda n: (-cost[n], n))[:KERNEL_ROWS]
    rows = [[_short(name), *(_kernel_cell(tables[arm].get(name)) for arm in arms)]
            for name in names]
    rows.append(["all kernels", *(f"{fmt(by_arm[arm].kernel_us, 1)} / {fmt(by_arm[arm].busy_us, 1)}"
                                  for arm in arms)])
    return md_table(["kernel", *arms], rows, "l" + "r" * len(arms))


def _kernel_cell(stat) -> str:
    if stat is None:
        return "-"
    return f"{stat.us_per_step:.1f} / {stat.exposed_us_per_step:.1f} ({stat.calls_per_step:g})"


def _diff_lines(arm: str, result: KindDiff) -> list[str]:
    lines = [f"**{arm} against the baseline.** {result.headline()}.", ""]
    changed = [c for c in result.changes if c.status != "same"]
    if changed:
        rows = [[c.status, _short(c.name), f"{c.base_us:.2f}", f"{c.head_us:.2f}",
                 f"{c.delta_us:+.2f}", f"{c.noise_us:.2f}", f"{c.base_calls:g} -> {c.head_calls:g}"]
                for c in changed]
        lines += [md_table(["", "kernel", "base µs", "head µs", "Δ µs", "noise µs", "calls"],
                           rows, "llrrrrl"), ""]
    return lines


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 3] + "..."
