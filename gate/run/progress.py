"""Where a running session says what it does: every line to the session's log file
(<out>/gate.log), a progress bar of its runs on stderr, and failures and warnings on stderr too,
so that stdout carries the summary alone."""

from __future__ import annotations

from pathlib import Path
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

LOG_FILE = "gate.log"


class SessionLog:
    """The session's log: to stderr until `open` names its directory, then to LOG_FILE there;
    `start` shows a bar of the runs to go on stderr, `advance` moves it."""

    def __init__(self) -> None:
        self.stderr = Console(stderr=True)
        self._file: IO[str] | None = None
        self._to: Console = self.stderr
        self._progress: Progress | None = None
        self._task = None

    def open(self, out: Path) -> None:
        """From now on the log goes to out/LOG_FILE (appended: a resumed session adds to it)."""
        self.close()
        self._file = (out / LOG_FILE).open("a", encoding="utf-8")
        self._to = Console(file=self._file, width=120, soft_wrap=True, no_color=True)
        self.stderr.print(f"logging to {out / LOG_FILE}")

    def log(self, message: str) -> None:
        """One line of the session's log, timed."""
        self._to.log(message, _stack_offset=2)

    def warn(self, message: str) -> None:
        """A line the person at the terminal should see (a failure, why the session stopped):
        in the log and on stderr."""
        self.log(message)
        if self._to is not self.stderr:
            (self._progress.console if self._progress else self.stderr).print(message)

    def start(self, total: int, description: str) -> None:
        """A progress bar of `total` steps on stderr."""
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  console=self.stderr, transient=False)
        self._progress.start()
        self._task = self._progress.add_task(description, total=total)

    def describe(self, description: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=description)

    def advance(self, steps: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, steps)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def close(self) -> None:
        self.stop()
        if self._file is not None:
            self._file.close()
            self._file, self._to = None, self.stderr
