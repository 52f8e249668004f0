"""The `resident-gate` command line: a thin typer layer over the gate library."""

from __future__ import annotations

import typer

from gate.commands.check import check
from gate.commands.phases import phases
from gate.commands.report import report
from gate.commands.run import run
from resident.cli_flags import NO_BUILTIN_HELP, HelpOpt, version_option

# every command, and the callback, takes HelpOpt (resident/cli_flags.py)
app = typer.Typer(no_args_is_help=True, add_completion=False, context_settings=NO_BUILTIN_HELP,
                  help="resident-gate: prove an engine change with alternated A/B server arms.")
app.command()(run)
app.command()(phases)
app.command()(report)
app.command()(check)


VersionOpt = version_option("resident-gate")


@app.callback()
def _root(
    version: VersionOpt = False,
    show_help: HelpOpt = False,
) -> None:
    """resident-gate: prove an engine change with alternated A/B server arms."""


def main() -> None:
    app()
