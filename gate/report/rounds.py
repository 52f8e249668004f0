"""rounds.md: per cell one row per arm and round with each run's tok/s, then every failed run
with its error and its server log's end."""

from __future__ import annotations

import pandas as pd

from gate.manifest import Manifest
from gate.report.markdown import (
    arms_line,
    cell_arms,
    fmt,
    fmt_slashed,
    fmt_tok,
    header_line,
    label,
    md_table,
    median,
    page_title,
    plural,
    round_label,
    tok_digits,
)
from gate.verdict import stats

ROUNDS_FILE = "rounds.md"
LOG_TAIL_LINES = 20


def _run_cell(run: pd.Series, digits: int) -> str:
    return fmt_tok(run[stats.THROUGHPUT], digits) if run["ok"] else "failed"


def _failed_text(runs: pd.DataFrame) -> str:
    requests = int(runs["failed"].fillna(0).sum())
    failed_runs = int((~runs["ok"]).sum())
    if not failed_runs:
        return str(requests)
    return f"{requests}, {plural(failed_runs, 'run')}"


def _round_row(runs: pd.DataFrame, label: str, round_index: int, run_numbers: list[int],
               digits: int) -> list[str]:
    ok = runs[runs["ok"]]
    by_run = {int(r["run"]): r for _, r in runs.iterrows()}
    tok = [_run_cell(by_run[n], digits) if n in by_run else "-" for n in run_numbers]
    return [label, round_label(round_index), *tok,
            fmt_slashed(median(ok["median_itl_ms"]), median(ok["mean_itl_ms"])),
            fmt(median(ok["median_ttft_ms"]), 1),
            fmt_slashed(*(median(ok[f"engine_{kind}_ms"]) for kind in stats.ENGINE_KINDS),
                         missing="n/a"),
            fmt(median(runs["sibling_busy_cpus"]), 1, missing="n/a"),
            _failed_text(runs)]


def _rounds_block(frame: pd.DataFrame, manifest: Manifest, cell: str,
                  flagged: set[str]) -> str:
    in_cell = frame[frame["cell"] == cell]
    run_numbers = sorted(int(n) for n in set(in_cell["run"]))
    header = ["arm", "round", *(f"tok/s run {n}" for n in run_numbers), "ITL p50/mean ms",
              "TTFT p50 ms", "server step ms decode/prefill/mixed", "sibling busy CPUs",
              "failed"]
    digits = tok_digits(list(in_cell.loc[in_cell["ok"], stats.THROUGHPUT]))
    rows = []
    for arm in cell_arms(frame, manifest, cell):
        of_arm = in_cell[in_cell["arm"] == arm]
        for round_index in sorted(set(of_arm["round"])):
            runs = of_arm[of_arm["round"] == round_index]
            rows.append(_round_row(runs, label(arm, flagged), int(round_index), run_numbers,
                                   digits))
    if not rows:
        return f"## {cell}\n\nNo runs."
    align = "ll" + "r" * (len(header) - 2)
    return f"## {cell}\n\n" + md_table(header, rows, align)


def _fence(text: str) -> str:
    longest = max((len(run) for run in text.split("\n") if set(run) == {"`"}), default=0)
    return "`" * max(3, longest + 1)


def _failed_run_block(run: pd.Series, flagged: set[str]) -> str:
    title = (f"### {label(run['arm'], flagged)} {run['cell']} {round_label(run['round'])} "
             f"run {int(run['run'])}")
    parts = [title, "", f"Error: {run['error'] or 'none recorded'}"]
    tail = run["log_tail"]
    if tail:
        lines = "\n".join(str(tail).rstrip("\n").split("\n")[-LOG_TAIL_LINES:])
        fence = _fence(lines)
        parts += ["", f"Server log, last {LOG_TAIL_LINES} lines at most:", "",
                  fence, lines, fence]
    return "\n".join(parts)


def _failed_runs_section(frame: pd.DataFrame, flagged: set[str]) -> str | None:
    failed = frame[~frame["ok"]].sort_values(["concurrency", "round", "arm", "run"],
                                             kind="stable")
    if failed.empty:
        return None
    blocks = [_failed_run_block(run, flagged) for _, run in failed.iterrows()]
    return "## Failed runs\n\n" + "\n\n".join(blocks)


def rounds_md(frame: pd.DataFrame, manifest: Manifest) -> str:
    """Per cell, one row per (arm, round) with each run's tok/s."""
    flagged = stats.planner_off_arms(frame, manifest)
    parts = [page_title(manifest, "runs by round"), header_line(manifest), arms_line(manifest),
             "Each row is one arm's server in one round (r1 is the first). tok/s per run "
             "(`failed`: the run could not be measured); ITL, TTFT, server step and sibling "
             "busy CPUs are medians over the row's runs; server step is the server's mean wall "
             "time in one engine step of that kind over the run (n/a: the server does not "
             "report it), for ITL and TTFT to be read against; failed counts failed requests "
             "(and failed runs)."]
    parts += [_rounds_block(frame, manifest, cell, flagged)
              for cell in stats.cell_order(frame, manifest)]
    failed = _failed_runs_section(frame, flagged)
    if failed:
        parts.append(failed)
    return "\n\n".join(parts) + "\n"
