"""summary.md and summary.json: per cell and arm the medians of a session's runs under vLLM's
names, the verdicts, latencies, CPU, health, and the lines that say what to read with care.

Every renderer is a pure function of the runs frame and the manifest, so a finished session's
reports can be rebuilt from runs.jsonl and manifest.json alone (`resident-gate report`).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from gate.manifest import Manifest
from gate.report import notes
from gate.report.markdown import (
    TableSpec,
    arms_line,
    cell_arms,
    fmt,
    fmt_pct,
    fmt_slashed,
    fmt_tok,
    header_line,
    label,
    md_table,
    median,
    num,
    page_title,
    plural,
    tok_digits,
)
from gate.report.timing import time_line, time_summary
from gate.verdict import stats

SUMMARY_FILE = "summary.md"
SUMMARY_JSON = "summary.json"


# ---- summary rows ----

# ServeMetrics fields a summary row carries as the median over the cell's ok runs
SUMMARY_MEDIANS = ("duration", "request_throughput", "output_throughput",
                   "total_token_throughput", *(f for f in stats.METRIC_FIELDS if f.endswith("_ms")))
# and those it sums over every run of the cell
SUMMARY_SUMS = ("completed", "failed", "total_input_tokens", "total_output_tokens")


def _total(values: pd.Series) -> int | None:
    """The sum, or None when a run lacks the number (a record from before it was kept)."""
    return None if values.isna().any() or values.empty else int(values.sum())


def _arm_cell_numbers(runs: pd.DataFrame) -> dict[str, Any]:
    """vLLM-named numbers of one arm in one cell: medians over ok runs, tok/s's range, and
    request and token counts summed over all its runs."""
    ok = runs[runs["ok"]]
    tok = ok[stats.THROUGHPUT].dropna()
    return {
        "max_concurrency": int(runs["concurrency"].iloc[0]),
        **{name: num(median(ok[name]), 3) for name in SUMMARY_MEDIANS},
        "output_throughput_min": num(tok.min() if len(tok) else None, 3),
        "output_throughput_max": num(tok.max() if len(tok) else None, 3),
        **{name: _total(runs[name]) for name in SUMMARY_SUMS},
    }


# the server's CPU seconds are /proc's clock ticks (10 ms): a run's reading below ten ticks is
# mostly their rounding (a short c=1 run's API process reads 0, one at c=4 one tick over its
# tokens), so it counts as not measured
PROC_CPU_READABLE_S = 0.1


def _server_cpu(runs: pd.DataFrame) -> dict[str, float | None]:
    """Medians over the ok runs: the launched server process's CPU (a resident arm's API
    process, one event loop) as a share of one core and in µs an output token, its
    descendants' (the engine core's) in cores, the load's client processes' (the gate's own
    event loop with one) in cores and in µs an output token, and how many there were. None
    where no run recorded it, and for the server's processes where the runs' median reading
    is under PROC_CPU_READABLE_S."""
    ok = runs[runs["ok"]]
    api, core, duration = _readable(ok["api_cpu_s"]), _readable(ok["core_cpu_s"]), ok["duration"]
    return {"api_cpu_share": num(median(api / duration), 3),
            "api_cpu_us_per_token": num(median(api / ok["total_output_tokens"] * 1e6), 1),
            "core_cpu_share": num(median(core / duration), 3),
            "client_cpu_share": num(median(ok["client_cpu_s"] / duration), 3),
            "client_cpu_us_per_token": num(
                median(ok["client_cpu_s"] / ok["total_output_tokens"] * 1e6), 1),
            "num_clients": num(median(ok["num_clients"]), 0)}


def _core_latency(runs: pd.DataFrame) -> dict[str, float | None]:
    """Medians over the ok runs of the server's mean TTFT parts (`core_queue_ms`,
    `core_prefill_ms`, `core_ttft_ms`: API arrival to the first token out of the engine core;
    None for a server without them)."""
    ok = runs[runs["ok"]]
    return {f"core_{part}_ms": num(median(ok[f"core_{part}_ms"]), 3)
            for part in stats.CORE_PARTS}


def _readable(seconds: pd.Series) -> pd.Series:
    """The runs' CPU seconds, or all missing where their median is below the ticks' reach."""
    known = seconds.dropna()
    if len(known) and known.median() < PROC_CPU_READABLE_S:
        return seconds.where(seconds.isna())  # NaN throughout
    return seconds


def _prefix_cache(runs: pd.DataFrame) -> dict[str, int | None]:
    """The prefix cache's hits, the prompt tokens they restored and the requests sent, summed
    over the runs that recorded hits (None when none did: a server without the counters, a
    record from before them)."""
    known = runs[[isinstance(c, dict) and "hits" in c for c in runs["prefix"]]]
    if known.empty:
        return dict.fromkeys(("prefix_hits", "prefix_saved_tokens", "prefix_requests"))
    return {"prefix_hits": sum(c["hits"] for c in known["prefix"]),
            "prefix_saved_tokens": sum(c["saved_tokens"] for c in known["prefix"]),
            "prefix_requests": int((known["completed"].fillna(0)
                                    + known["failed"].fillna(0)).sum())}


def _window_arrivals(runs: pd.DataFrame) -> int | None:
    """The requests late launch's windows took over the runs that recorded the counter (None
    when none did)."""
    known = runs["window_arrivals"].dropna()
    return int(known.sum()) if len(known) else None


def _core_gc_share(runs: pd.DataFrame) -> float | None:
    """The median over the ok runs that recorded it of the share of the run's wall the
    engine core's garbage collector paused it (None when none did)."""
    ok = runs[runs["ok"] & runs["core_gc_s"].notna() & (runs["duration"] > 0)]
    return num(median(ok["core_gc_s"] / ok["duration"]), 5) if len(ok) else None


def _arm_cell_health(runs: pd.DataFrame, planner_off: bool) -> dict[str, Any]:
    return {
        "runs_ok": int(runs["ok"].sum()),
        "runs_failed": int((~runs["ok"]).sum()),
        "tracebacks": int(runs["server_tracebacks"].max()),
        "recompile_limit_lines": int(runs["recompile_limit_lines"].max()),
        "planner_off": planner_off,
    }


def _vs(arm_median: float, base_median: float) -> float | None:
    if math.isnan(arm_median) or math.isnan(base_median) or base_median == 0:
        return None
    return round(arm_median / base_median - 1.0, 4)


def summary_rows(frame: pd.DataFrame, manifest: Manifest,
                 verdicts: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per cell (manifest order) and arm (manifest order) that has runs in that cell:
    the session's JSON result (summary.json).

    Rates and latencies are named as `vllm bench serve --save-result` names them, each the
    median over the ok runs of all rounds of that run's number; output_throughput_min/max is
    tok/s's range over those runs; completed and failed requests and the token totals are sums
    over every run. `vs_baseline` is the medians' ratio - 1 against the baseline of what the
    verdicts judge (`judged`, a stats.MEASURES key: tok/s, or in an open loop `ttft`, 1000 /
    TTFT p50; None for the baseline, as `verdict`); health: failed runs, the most tracebacks and
    recompile-limit lines one server log held, and whether the arm asked for the planner and did
    not get it; the server's and the client's CPU (`_server_cpu`: api_cpu_share,
    api_cpu_us_per_token, core_cpu_share, client_cpu_share); the prefix cache's hits and
    restored prompt tokens over the runs that recorded them, and those runs' requests
    (`prefix_hits`, `prefix_saved_tokens`, `prefix_requests`; None for a server without them);
    the requests late launch's windows took over the runs (`window_arrivals`; None likewise);
    the share of a run's wall the engine core's garbage collector paused it (`core_gc_share`,
    the median over runs; None likewise);
    the server's mean TTFT parts (`_core_latency`: core_queue_ms, core_prefill_ms,
    core_ttft_ms, each run's mean over its requests, the median over runs);
    open loop, the requests that arrived with every slot busy and waited for one
    (`requests_waited`).
    """
    baseline = manifest.baseline
    flagged = stats.planner_off_arms(frame, manifest)
    measure = stats.measure_of(manifest)
    rows = []
    for cell in stats.cell_order(frame, manifest):
        in_cell = frame[frame["cell"] == cell]
        base_ok = in_cell[(in_cell["arm"] == baseline) & in_cell["ok"]]
        base_median = median(base_ok[stats.JUDGED])
        for arm in cell_arms(frame, manifest, cell):
            runs = in_cell[in_cell["arm"] == arm]
            arm_median = median(runs.loc[runs["ok"], stats.JUDGED])
            is_base = arm == baseline
            rows.append({
                "cell": cell, "arm": arm, **_arm_cell_numbers(runs), **_server_cpu(runs),
                **_core_latency(runs),
                **_prefix_cache(runs), "window_arrivals": _window_arrivals(runs),
                "core_gc_share": _core_gc_share(runs),
                "requests_waited": int(runs["num_waited"].sum()),
                "judged": measure,
                "vs_baseline": None if is_base else _vs(arm_median, base_median),
                "verdict": None if is_base else stats.verdict_of(verdicts, cell, arm)["verdict"],
                **_arm_cell_health(runs, arm in flagged),
            })
    return rows


# ---- summary.md ----

def _tok_range(row: dict[str, Any]) -> str:
    if row["output_throughput"] is None:
        return "no ok run"
    values = [row["output_throughput_min"], row["output_throughput"],
              row["output_throughput_max"]]
    low, mid, high = (fmt_tok(value, tok_digits(values)) for value in values)
    return f"{mid} [{low}-{high}]"


def _verdict_text(row: dict[str, Any], baseline: str) -> tuple[str, str]:
    """(vs baseline, verdict) of a row; the baseline's own row says `baseline`."""
    if row["arm"] == baseline:
        return "", "baseline"
    return fmt_pct(row["vs_baseline"]), row["verdict"]


# the latency table's columns: title, and the ServeMetrics fields slashed together
LATENCY_COLUMNS = (
    ("TTFT p50/p90/p99", ("median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms")),
    ("TPOT p50/p90/p99", ("median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms")),
    ("ITL mean/p50/p90/p99", ("mean_itl_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms")),
    ("E2EL p50/p90/p99", ("median_e2el_ms", "p90_e2el_ms", "p99_e2el_ms")),
)


def summary_tables(rows: list[dict[str, Any]], baseline: str,
                   flagged: set[str]) -> list[TableSpec]:
    """The summary's tables, as summary.md and the stdout table render them: throughput with
    the verdicts, latencies (ms), and the server's and the client's CPU."""
    throughput = [[row["cell"], label(row["arm"], flagged), _tok_range(row),
                   fmt(row["request_throughput"], 2), *_verdict_text(row, baseline)]
                  for row in rows]
    # an open loop's vs and verdicts judge TTFT (stats.measure_of)
    judged = "" if not rows or rows[0]["judged"] == "tok/s" else " (1/TTFT p50)"
    latency = [[row["cell"], label(row["arm"], flagged),
                *(fmt_slashed(*(row[field] for field in fields))
                  for _, fields in LATENCY_COLUMNS)] for row in rows]
    cpu = [[row["cell"], label(row["arm"], flagged), fmt(row["api_cpu_share"], 2),
            fmt(row["api_cpu_us_per_token"], 1), fmt(row["core_cpu_share"], 2),
            _clients_text(row), fmt(row["client_cpu_us_per_token"], 1)] for row in rows]
    return [
        TableSpec("Throughput", ["cell", "arm", "tok/s median [min-max]", "req/s",
                                 f"vs {baseline}{judged}", "verdict"], throughput, "llrrrl"),
        TableSpec("Latency (ms)", ["cell", "arm", *(title for title, _ in LATENCY_COLUMNS)],
                  latency, "ll" + "r" * len(LATENCY_COLUMNS)),
        TableSpec("Server and client CPU", ["cell", "arm", "API process (cores)", "API µs a token",
                                 "engine core (cores)", "client (cores)",
                                 "client µs a token"], cpu, "llrrrrr"),
    ]


def _clients_text(row: dict[str, Any]) -> str:
    """The client processes' cores, and how many processes when more than one."""
    cores = fmt(row["client_cpu_share"], 2)
    return cores if (row["num_clients"] or 1) == 1 else f"{cores} ({row['num_clients']:.0f})"


def _arm_health(rows: list[dict[str, Any]], arm: str) -> list[str]:
    mine = [row for row in rows if row["arm"] == arm]
    failures = [(sum(r["runs_failed"] for r in mine), "failed run"),
                (sum(r["failed"] or 0 for r in mine), "failed request")]
    # log counts are cumulative per server, so the most one log held is what is known
    in_log = [(max(r["tracebacks"] for r in mine), "traceback"),
              (max(r["recompile_limit_lines"] for r in mine), "recompile-limit line")]
    return ([plural(count, noun) for count, noun in failures if count]
            + [f"{plural(count, noun)} in one server log" for count, noun in in_log if count])


def _health_lines(rows: list[dict[str, Any]], arms: list[str], flagged: set[str]) -> list[str]:
    lines = []
    for arm in arms:
        if not any(row["arm"] == arm for row in rows):
            continue
        health = _arm_health(rows, arm)
        if health:
            lines.append(f"- {label(arm, flagged)}: {', '.join(health)}.")
        if arm in flagged:
            lines.append(f"- {arm}: resident planning was asked for and did not come on; "
                         "its numbers are the host-planned path's.")
    return lines or ["- 0 failed runs and requests, no traceback and no recompile-limit line "
                     "in any arm."]


def summary_flagged(rows: list[dict[str, Any]], manifest: Manifest) -> set[str]:
    """Arms flagged planner-off in the manifest or in any summary row."""
    return manifest.planner_off_arms | {r["arm"] for r in rows if r["planner_off"]}


def _judged_text(manifest: Manifest, baseline: str) -> str:
    """What `vs baseline` and the verdicts judge (stats.measure_of)."""
    if stats.measure_of(manifest) == "tok/s":
        return (f"vs {baseline}: the tok/s medians' ratio. Verdicts are paired by round "
                "(paired.md).")
    return (f"Open loop: tok/s is the arrival rate whatever the arms do, so vs {baseline} and "
            "the verdicts judge TTFT: the medians' ratio of 1000 / TTFT p50 (above 0: a lower "
            "TTFT), verdicts paired by round (paired.md).")


def summary_md(rows: list[dict[str, Any]], manifest: Manifest) -> str:
    """Per cell and arm: tok/s median [min-max], req/s, vs baseline and verdict; then TTFT,
    TPOT, ITL and E2EL percentiles; then each arm's health."""
    baseline = summary_baseline(manifest)
    arms = manifest.arm_names
    arms += [row["arm"] for row in rows if row["arm"] not in arms]
    arms = list(dict.fromkeys(arms))
    flagged = summary_flagged(rows, manifest)
    parts = [page_title(manifest, "summary"), header_line(manifest), arms_line(manifest),
             time_line(manifest),
             "Each number is the median over the ok runs of all rounds of that run's value "
             "(tok/s's range beside it): tok/s is output tokens over the run's wall time, "
             "req/s completed requests over it; TTFT the time to a request's first token, TPOT "
             "its time per output token after the first, ITL every gap between its tokens, "
             "E2EL the request's whole time. summary.json holds these rows under vLLM's names "
             f"(`vllm bench serve --save-result`). {_judged_text(manifest, baseline)} "
             "Server and client CPU: CPU time over "
             "a run (from /proc) of the process the gate launched (a resident arm's API "
             "process, whose event loop is one thread: near 1.00 it is the limit), of its "
             "descendants (the engine core) and of the gate's load clients (each one event "
             "loop; in brackets how many processes, where more than one; their CPU while "
             "they send the measured requests, start-up and warm-up left out), over the "
             "run's wall time. /proc counts the server's in 10 ms ticks: where its runs read "
             f"under {PROC_CPU_READABLE_S:g} s (short runs) the table says - , not a rounding."]
    if rows:
        parts += [f"## {table.title}\n\n" + md_table(table.header, table.rows, table.align)
                  for table in summary_tables(rows, baseline, flagged)]
    else:
        parts.append("No runs.")
    parts.append("\n".join(_health_lines(rows, arms, flagged) + notes.short_run_lines(rows)
                           + notes.cpu_bound_lines(rows) + notes.prefix_cache_lines(rows)
                           + notes.window_lines(rows)
                           + notes.gc_lines(rows)
                           + notes.core_ttft_lines(rows)
                           + notes.waited_lines(rows)
                           + notes.host_load_lines(manifest)
                           + notes.next_step_lines(rows, manifest)))
    return "\n\n".join(parts) + "\n"


def summary_baseline(manifest: Manifest) -> str:
    """The baseline's name as the summary's tables head its column: `vs main` where a
    manifest names none."""
    return manifest.baseline or "main"


def summary_json(rows: list[dict[str, Any]], manifest: Manifest) -> dict[str, Any]:
    """The session's JSON result: its name and baseline, where its time went (`timing`:
    gate/report/timing.py's time_summary, None when not recorded), and the summary rows as
    `cells`."""
    return {"name": manifest.name or None, "baseline": manifest.baseline,
            "timing": time_summary(manifest), "cells": rows}
