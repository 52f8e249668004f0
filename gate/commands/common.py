"""What `run` and `phases` share: the session their options describe, the client pinned, and a
bad option's ValueError turned into a CLI error that names it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console

from gate.config import GateConfig
from gate.run.estimate import long_session_warning
from gate.run.session import Session

S = TypeVar("S", bound=Session)


@contextmanager
def bad_parameter() -> Iterator[None]:
    try:
        yield
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def open_session(session_type: type[S], config_file: Path | None, given: dict[str, Any],
                 console: Console, label: str) -> S:
    """The session of a command's options (`given`: option_fields of them) over its --config
    file, with this process pinned to the client CPUs."""
    with bad_parameter():
        config = GateConfig.from_options(config_file, given)
        session = session_type(config, Path.cwd(), sys.argv)
    return start_session(session, console, label)


def start_session(session: S, console: Console, label: str) -> S:
    """Pins this process to the session's client CPUs and logs where the session goes."""
    if session.placement.client_cpus:
        os.sched_setaffinity(0, session.placement.client_cpus)
    warning = long_session_warning(session.config, len(session.arms))
    if warning and label != "check":
        console.print(warning, style="yellow", markup=False)
    console.log(f"{label} {session.out}: arms {', '.join(a.name for a in session.arms)}, "
                f"placement {session.placement.to_dict()}")
    return session


def exit_if_failed(console: Console, session: Session, failed: int, what: str) -> None:
    if failed:
        console.log(f"[red]{failed} {what}(s) failed[/red]: " + "; ".join(session.failures[:5]))
        raise typer.Exit(1)
