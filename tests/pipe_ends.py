"""The API processes' ends of real pipes (resident/server/pipes.py), for tests of the engine
core's side: listeners that a CorePipes connects to, read as an API process reads them."""

from __future__ import annotations

import selectors
import time
from pathlib import Path

from resident.server.pipes import Pipe, listen, selector_wait


class ApiEnds:
    """`count` API processes' pipe ends under `directory`, in api_index order (`paths`)."""

    def __init__(self, directory: str | Path, count: int) -> None:
        self.paths = [str(Path(directory) / f"pipe-{index}") for index in range(count)]
        self._listeners = [listen(path) for path in self.paths]
        self._pipes: list[Pipe | None] = [None] * count

    def read(self, index: int, timeout_s: float = 5.0) -> list:
        """The messages process `index` has received, waiting up to `timeout_s` for one
        (none: nothing came in time)."""
        deadline = time.monotonic() + timeout_s
        pipe = self._pipe(index, deadline)
        while pipe is not None:
            messages = pipe.receive()
            if messages or pipe.closed or time.monotonic() >= deadline:
                return messages
            selector_wait(pipe.sock, selectors.EVENT_READ, deadline - time.monotonic())
        return []

    def pipe(self, index: int, timeout_s: float = 5.0) -> Pipe:
        """Process `index`'s end of its pipe, once the core connected."""
        pipe = self._pipe(index, time.monotonic() + timeout_s)
        assert pipe is not None, f"the core did not connect to {self.paths[index]}"
        return pipe

    def _pipe(self, index: int, deadline: float) -> Pipe | None:
        while self._pipes[index] is None and time.monotonic() < deadline:
            try:
                sock, _ = self._listeners[index].accept()
            except BlockingIOError:
                selector_wait(self._listeners[index], selectors.EVENT_READ,
                              deadline - time.monotonic())
            else:
                self._pipes[index] = Pipe(sock)
        return self._pipes[index]

    def close(self) -> None:
        for pipe in self._pipes:
            if pipe is not None:
                pipe.close()
        for listener in self._listeners:
            listener.close()

    def __enter__(self) -> ApiEnds:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
