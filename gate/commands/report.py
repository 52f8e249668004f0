"""`resident-gate report DIR`: rebuild a finished session's tables and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gate.commands import options as opt
from gate.manifest import MANIFEST_FILE, Manifest
from gate.records import RUNS_FILE, read_profiles
from gate.report.output import OutputFormat, print_summary
from gate.report.profile import PROFILE_FILE
from gate.report.write import REPORT_FILES, write_reports
from resident.cli_flags import HelpOpt


def _session_dir(directory: Path) -> Path:
    for name in (RUNS_FILE, MANIFEST_FILE):
        if not (directory / name).is_file():
            raise typer.BadParameter(f"{directory} has no {name}", param_hint="DIRECTORY")
    return directory


def report(
    directory: Annotated[Path, typer.Argument(
        exists=True, file_okay=False, dir_okay=True, callback=_session_dir, metavar="DIR",
        help="A session directory holding runs.jsonl and manifest.json.")],
    output_format: opt.FormatOpt = OutputFormat.table,
    show_help: HelpOpt = False,
) -> None:
    """Rebuild a session's tables, plots and verdicts from runs.jsonl and manifest.json (and
    profile.md from profiles.jsonl)."""
    rows = write_reports(directory)
    written = [*REPORT_FILES, *([PROFILE_FILE] if read_profiles(directory) else [])]
    typer.echo(f"wrote {', '.join(written)} in {directory}", err=True)
    print_summary(rows, Manifest.read(directory), output_format, directory)
