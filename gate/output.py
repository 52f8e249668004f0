"""The one render path for a session's summary on stdout: a rich table, JSON or markdown.

Only the summary goes to stdout, so `--format json` output can be piped; progress and log
messages go to stderr.
"""

from __future__ import annotations

import enum
import json
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gate import check_report, phases, tables
from gate.markdown import ReportTable

WIDE = 200  # columns for a summary that no terminal will wrap


class OutputFormat(enum.StrEnum):
    table = "table"
    json = "json"
    md = "md"


def summary_table(rows: list[dict[str, Any]], manifest: dict[str, Any]) -> Table:
    """The summary rows as a rich Table (cell, arm, tok/s, ITL, TTFT, vs baseline, verdict)."""
    baseline = manifest.get("baseline", "main")
    table = Table(title=f"{manifest.get('name') or 'gate session'}: summary", box=box.SIMPLE_HEAD,
                  caption=Text("tok/s: median [min-max] over ok runs; ITL and TTFT in ms"))
    table.add_column("cell", no_wrap=True)
    table.add_column("arm", min_width=4, overflow="fold")  # folds only in a narrow terminal
    # numbers keep their width; headers and verdicts wrap at spaces
    for name in ("tok/s", "ITL p50/mean", "TTFT p50"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column(f"vs {baseline}", justify="right", min_width=7)
    table.add_column("verdict", min_width=8)  # "baseline" whole; longer verdicts wrap at spaces
    for row in rows:
        table.add_row(*(Text(cell) for cell in tables.summary_cells(row, baseline)))
    return table


def print_summary(rows: list[dict[str, Any]], manifest: dict[str, Any],
                  fmt: OutputFormat) -> None:
    """Print the summary rows on stdout as `fmt`: table, json (`{"cells": rows}`) or md."""
    if fmt == OutputFormat.json:
        sys.stdout.write(json.dumps({"cells": rows}, indent=2) + "\n")
    elif fmt == OutputFormat.md:
        sys.stdout.write(tables.summary_md(rows, manifest))
    else:
        # a terminal wraps the table at its width; a pipe or file gets the table's own width
        terminal = sys.stdout.isatty()
        Console(file=sys.stdout, width=None if terminal else WIDE).print(
            summary_table(rows, manifest))


def print_phases(results: dict[str, Any], manifest: dict[str, Any], fmt: OutputFormat) -> None:
    """A phases session on stdout as `fmt`: its two tables, or json (`{"cells": results}`)."""
    if fmt == OutputFormat.json:
        sys.stdout.write(json.dumps({"cells": results}, indent=2) + "\n")
        return
    if fmt == OutputFormat.md:
        sys.stdout.write(phases.phases_md(results, manifest))
        return
    print_tables(phases.phase_tables(results, [arm["name"] for arm in manifest["arms"]]))


def print_tables(tables: list[ReportTable]) -> None:
    """Report tables on stdout as rich tables, each column justified as its markdown's."""
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else WIDE)
    for spec in tables:
        table = Table(title=spec.title, box=box.SIMPLE_HEAD)
        for name, align in zip(spec.header, spec.align, strict=True):
            table.add_column(name, justify="left" if align == "l" else "right")
        for row in spec.rows:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)


def print_check(report: dict[str, Any], manifest: dict[str, Any], fmt: OutputFormat) -> None:
    """A check on stdout as `fmt`: its verdict and tables, json (check.json's report) or md
    (check.md)."""
    if fmt == OutputFormat.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    if fmt == OutputFormat.md:
        sys.stdout.write(check_report.check_md(report, manifest))
        return
    print_tables(check_report.check_tables(report))
    Console(file=sys.stdout).print(Text(f"verdict: {report['verdict']}", style="bold"))
