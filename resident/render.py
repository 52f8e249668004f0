"""One render path for every command's results: a rich table on stdout, or JSON."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


class OutputFormat(enum.StrEnum):
    table = "table"
    json = "json"


Section = dict[str, Any] | Sequence[dict[str, Any]]


def render(
    sections: dict[str, Section],
    output_format: OutputFormat,
    console: Console | None = None,
) -> None:
    """Prints named sections: a mapping (a two-column table) or rows sharing their keys. JSON
    output is the same sections, as they are."""
    if output_format is OutputFormat.json:
        print(json.dumps(sections, indent=2))
        return
    console = console or Console()
    for title, section in sections.items():
        rows = ([{"what": _label(k), "value": v} for k, v in section.items()]
                if isinstance(section, dict) else section)
        if not rows:
            continue
        table = Table(title=_label(title), title_justify="left")
        for column in rows[0]:
            table.add_column(_label(column), justify="left" if column in _TEXT else "right")
        for row in rows:
            table.add_row(*(_cell(row.get(column)) for column in rows[0]))
        console.print(table)


_TEXT = {"what", "value", "name", "model", "arm", "phase"}


def _label(key: str) -> str:
    return key.replace("_", " ")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
