"""The `resident-gate` command line: a thin typer layer over the gate library."""

from __future__ import annotations

from typing import Annotated

import typer

from gate import options as opt
from gate.commands.check import check
from gate.commands.phases import phases
from gate.commands.report import report
from gate.commands.run import run
from resident.provenance import package_version

# no built-in --help: each command takes opt.HelpOpt, a flag listed as one
app = typer.Typer(no_args_is_help=True, add_completion=False,
                  context_settings={"help_option_names": []},
                  help="resident-gate: prove an engine change with alternated A/B server arms.")
app.command()(run)
app.command()(phases)
app.command()(report)
app.command()(check)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"resident-gate {package_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", metavar="", is_eager=True, expose_value=False, callback=_print_version,
        help="Print the version and exit.")] = False,
    show_help: opt.HelpOpt = False,
) -> None:
    """resident-gate: prove an engine change with alternated A/B server arms."""


def main() -> None:
    app()
