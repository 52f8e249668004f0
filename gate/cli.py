"""The `resident-gate` command line: a thin typer layer over the gate library."""

from __future__ import annotations

import typer

from gate.commands.check import check
from gate.commands.phases import phases
from gate.commands.report import report
from gate.commands.run import run

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="resident-gate: prove an engine change with alternated A/B server arms.")
app.command()(run)
app.command()(phases)
app.command()(report)
app.command()(check)


def main() -> None:
    app()
