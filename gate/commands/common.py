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

from gate.commands import options as opt
from gate.config import build_gate_config
from gate.run.session import Session

S = TypeVar("S", bound=Session)


@contextmanager
def bad_parameter() -> Iterator[None]:
    try:
        yield
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def open_session(session_type: type[S], given: dict[str, Any], console: Console,
                 label: str) -> S:
    """The session of a command's parameters (its `locals()` on entry), with this process
    pinned to the client CPUs."""
    with bad_parameter():
        config = build_gate_config(opt.gate_options(given), given["config"])
        session = session_type(config, Path.cwd(), sys.argv)
    return start_session(session, console, label)


def start_session(session: S, console: Console, label: str) -> S:
    """Pins this process to the session's client CPUs and logs where the session goes."""
    if session.placement.client_cpus:
        os.sched_setaffinity(0, session.placement.client_cpus)
    console.log(f"{label} {session.out}: arms {', '.join(a.name for a in session.arms)}, "
                f"placement {session.placement.to_dict()}")
    return session


def exit_if_failed(console: Console, session: Session, failed: int, what: str) -> None:
    if failed:
        console.log(f"[red]{failed} {what}(s) failed[/red]: " + "; ".join(session.failures[:5]))
        raise typer.Exit(1)
