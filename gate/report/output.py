"""The one render path for a session's summary on stdout: a rich table, JSON or markdown.

Only the summary goes to stdout, so `--format json` output can be piped; progress and log
messages go to stderr.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gate.manifest import Manifest
from gate.report import notes, phases, summary
from gate.report.markdown import TableSpec

WIDE = 200  # columns for a summary that no terminal will wrap


class OutputFormat(enum.StrEnum):
    table = "table"
    json = "json"
    md = "md"


def rich_table(spec: TableSpec) -> Table:
    """A report table for the terminal: numbers keep their width, text columns wrap at spaces
    only in a narrow terminal."""
    table = Table(title=spec.title, box=box.SIMPLE_HEAD)
    for name, align in zip(spec.header, spec.align, strict=True):
        if align == "r":
            table.add_column(name, justify="right", no_wrap=True)
        else:
            table.add_column(name, overflow="fold")
    for row in spec.rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def _console() -> Console:
    # a terminal wraps a table at its width; a pipe or file gets the table's own width
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else WIDE)


def render(fmt: OutputFormat, as_json: Callable[[], Any], as_md: Callable[[], str],
            specs: Callable[[], list[TableSpec]], footer: str | None = None) -> None:
    """One report on stdout as `fmt`: json (`as_json()`, indented), md (`as_md()`) or the
    terminal's tables (`specs()`, then `footer` in bold)."""
    if fmt == OutputFormat.json:
        sys.stdout.write(json.dumps(as_json(), indent=2) + "\n")
    elif fmt == OutputFormat.md:
        sys.stdout.write(as_md())
    else:
        console = _console()
        for spec in specs():
            console.print(rich_table(spec))
        if footer is not None:
            console.print(Text(footer, style="bold"))


def print_summary(rows: list[dict[str, Any]], manifest: Manifest, fmt: OutputFormat,
                  directory: Path | None = None) -> None:
    """Print the summary rows on stdout as `fmt`: table (its tables, then whether the host was
    busy and the next step when a verdict needs more rounds), json (the session's JSON
    result, as summary.json holds it) or md (summary.md). `directory`: the session's, named
    in the next step."""
    lines = notes.host_load_lines(manifest) + notes.next_step_lines(rows, manifest, directory)
    footer = "\n".join(line.removeprefix("- ") for line in lines)
    render(fmt, lambda: summary.summary_json(rows, manifest),
           lambda: summary.summary_md(rows, manifest),
           lambda: summary.summary_tables(rows, summary.summary_baseline(manifest),
                                         summary.summary_flagged(rows, manifest)),
           footer=footer or None)


def print_phases(results: dict[str, Any], manifest: Manifest, fmt: OutputFormat) -> None:
    """A phases session on stdout as `fmt`: its two tables, or json (`{"cells": results}`)."""
    render(fmt, lambda: {"cells": results}, lambda: phases.phases_md(results, manifest),
           lambda: phases.phase_tables(results, manifest.arm_names))
