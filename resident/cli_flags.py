"""The flags both command lines share (`resident` and `resident-gate`): --help and --version
listed as flags. Typer lists its built-in --help with a <bool> metavar, so an app using HelpOpt
turns the built-in off with NO_BUILTIN_HELP and gives every command, and its callback, HelpOpt.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from resident.provenance import package_version

NO_BUILTIN_HELP = {"help_option_names": []}


def _show_help(ctx: typer.Context, value: bool) -> None:
    if value:
        typer.echo(ctx.get_help(), nl=False)
        raise typer.Exit()


HelpOpt = Annotated[bool, typer.Option(
    "--help", metavar="", is_eager=True, expose_value=False, callback=_show_help,
    help="Show this message and exit.")]


def version_option(program: str) -> Any:
    """The Annotated type of a --version flag that prints `program <version>` and exits."""
    def print_version(value: bool) -> None:
        if value:
            typer.echo(f"{program} {package_version()}")
            raise typer.Exit()

    return Annotated[bool, typer.Option(
        "--version", metavar="", is_eager=True, expose_value=False, callback=print_version,
        help="Print the version and exit.")]
